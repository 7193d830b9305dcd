"""Which sandbox a later bridge may reach: only one running its own agent; and which warm
sandbox it pools: only one made as it would make it (its shape).

Reaching a durable sandbox runs its image's handover, and its agent speaks the frames of its own
version, so a bridge of another kernelbridge (an upgrade) does not reach it: the session is lost
(said, restorable from its journal) and a warm sandbox is replaced. The agent travels as the
``kernelbridge.agent-hash`` label on every runtime: the image's own on podman and docker, set from
the spec for those that do not copy image labels (a Kubernetes pod's annotations). The shape is
a digest of what a sandbox is made with but whose it is (name, owner).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kernelbridge.config import Mount, SandboxLimits, Settings
from kernelbridge.host.container import container_spec, state_identity
from kernelbridge.runtime import ContainerInfo, ContainerState
from kernelbridge.runtime.base import (
    AGENT_LABEL,
    DURABLE_LABEL,
    MOUNTS_LABEL,
    SESSION_LABEL,
    SHAPE_LABEL,
    STATE_LABEL,
)
from kernelbridge.runtime.engine.body import create_body
from kernelbridge.runtime.kube.manifest import pod_manifest
from kernelbridge.session.adoption import OTHER_MOUNTS, Loss, check_container, other_agent
from kernelbridge.session.records import SessionRecord

AGENT = "a1" * 32


def record() -> SessionRecord:
    return SessionRecord(
        session="s", generation=1, created=0.0, owner_pid=1, owner_host="h", container="c", durable=True
    )


def info(state_dir: Path, rec: SessionRecord, agent: str | None) -> ContainerInfo:
    labels = {SESSION_LABEL: rec.container_label, STATE_LABEL: state_identity(state_dir), DURABLE_LABEL: "1"}
    if agent is not None:
        labels[AGENT_LABEL] = agent
    return ContainerInfo("id", "c", labels, ContainerState.RUNNING)


def test_a_sandbox_of_this_bridges_agent_may_be_reached(tmp_path: Path) -> None:
    rec = record()
    assert check_container(info(tmp_path, rec, AGENT), rec, tmp_path, "secret", AGENT) is None
    assert other_agent(info(tmp_path, rec, AGENT), AGENT) is None


def test_a_sandbox_of_another_agent_is_lost_and_removed_before_it_is_reached(tmp_path: Path) -> None:
    rec = record()
    for found, said in (("b2" * 32, "b2b2b2b2b2b2"), (None, "unknown")):
        loss = check_container(info(tmp_path, rec, found), rec, tmp_path, "secret", AGENT)
        assert loss is not None and loss.remove, found
        assert "another kernelbridge" in loss.reason and said in loss.reason and AGENT[:12] in loss.reason


def test_a_bridge_that_expects_no_agent_reaches_any(tmp_path: Path) -> None:
    """The local test double's bridges expect none (its sandboxes have no image)."""
    rec = record()
    assert check_container(info(tmp_path, rec, None), rec, tmp_path, "secret", None) is None


def test_every_runtime_labels_the_sandbox_with_its_agent(tmp_path: Path) -> None:
    spec = container_spec(Settings(state_dir=tmp_path), "s", "img:1", agent_hash=AGENT, durable=True)
    assert spec.all_labels()[AGENT_LABEL] == AGENT
    assert create_body(spec)["Labels"][AGENT_LABEL] == AGENT  # the engine API's
    assert pod_manifest(spec)["metadata"]["annotations"][AGENT_LABEL] == AGENT  # a pod's, exact
    assert AGENT_LABEL not in container_spec(Settings(state_dir=tmp_path), "s", "img:1").all_labels()


def test_a_warm_sandbox_made_otherwise_has_another_shape(tmp_path: Path) -> None:
    """What a bridge checks before pooling a warm sandbox a bridge before left: each setting that
    changes what a sandbox is gives another shape; whose it is does not."""
    settings = Settings(state_dir=tmp_path)
    (tmp_path / "data").mkdir()

    def shape(image: str = "img:1", **changed: object) -> str:
        made = replace(settings, **changed) if changed else settings
        return container_spec(made, "warm", image, agent_hash=AGENT, durable=True).shape

    same = container_spec(settings, "s", "img:1", agent_hash=AGENT, durable=True)
    assert same.all_labels()[SHAPE_LABEL] == same.shape == shape()  # another name, pid: one shape
    others = [
        shape("img:2"),
        shape(mounts=(Mount(tmp_path / "data", "/data"),)),
        shape(limits=SandboxLimits(memory="256m")),
        shape(labels=(("team", "b"),)),
        container_spec(settings, "warm", "img:1", agent_hash="b2" * 32, durable=True).shape,
    ]
    assert len({shape(), *others}) == len(others) + 1


def test_a_session_seeing_other_host_directories_is_not_taken_over(tmp_path: Path) -> None:
    """A mount taken away from the settings: the session's sandbox, which still sees it, is lost
    (and removed) rather than adopted; the same mounts, or none both times, are adopted."""
    (tmp_path / "data").mkdir()
    settings = Settings(state_dir=tmp_path)
    shared = replace(settings, mounts=(Mount(tmp_path / "data", "/data"),))
    rec = record()
    for started, now in ((shared, settings), (settings, shared)):
        seen = info(tmp_path, rec, AGENT)
        seen.labels[MOUNTS_LABEL] = container_spec(started, "s", "img:1").mounts_shape
        expected = container_spec(now, "s", "img:1").mounts_shape
        loss = check_container(seen, rec, tmp_path, "secret", AGENT, expected)
        assert loss == Loss(OTHER_MOUNTS, True)
        assert check_container(seen, rec, tmp_path, "secret", AGENT, seen.labels[MOUNTS_LABEL]) is None
    unlabelled = info(tmp_path, rec, AGENT)  # a sandbox of a kernelbridge before the label
    loss = check_container(
        unlabelled, rec, tmp_path, "secret", AGENT, container_spec(settings, "s", "i").mounts_shape
    )
    assert loss is not None and loss.reason == OTHER_MOUNTS
