"""The sandbox flags are decided once (runtime.flags) and the three renderers agree on them; a
durable sandbox is labelled so (a later bridge reaches it through an exec session), and the CLI
backend, which cannot reach it again, refuses it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelbridge.config import Mount, SandboxLimits
from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime import ContainerSpec
from kernelbridge.runtime.base import DURABLE_LABEL
from kernelbridge.runtime.cli.backend import CliRuntime
from kernelbridge.runtime.engine.api import EngineRuntime
from kernelbridge.runtime.engine.body import create_body
from kernelbridge.runtime.engine.endpoint import Endpoint
from kernelbridge.runtime.flags import (
    BIND_OPTIONS,
    READ_ONLY_TMPFS,
    WORKDIR,
    sandbox_flags,
    size_bytes,
    unsupported,
)
from kernelbridge.runtime.kube.manifest import pod_manifest

LIMITS = SandboxLimits(
    memory="300m",
    pids=77,
    cpus=0.25,
    tmp_size="12m",
    workspace_size="34m",
    packages_size="56m",
    nofile=555,
    nproc=666,
)


def spec(**fields: Any) -> ContainerSpec:
    base: dict[str, Any] = {
        "image": "img:1",
        "name": "kb-s-1",
        "session": "s",
        "owner_pid": 9,
        "limits": LIMITS,
    }
    return ContainerSpec(**{**base, **fields})


def test_the_decisions_are_made_once() -> None:
    flags = sandbox_flags(spec())
    assert [(m.path, m.size, m.covers_engine_default) for m in flags.tmpfs] == [
        ("/tmp", "12m", False),
        (WORKDIR, "34m", False),
        ("/packages", "56m", False),
        ("/var/tmp", "64k", True),
        ("/run", "64k", True),
    ]
    assert {m.options for m in flags.tmpfs if m.covers_engine_default} == {READ_ONLY_TMPFS}
    assert [(u.name, u.soft, u.hard) for u in flags.ulimits] == [("nofile", 555, 555), ("nproc", 666, 666)]
    assert (flags.stdin_once, flags.init, flags.auto_remove, flags.pull) == (True, False, False, False)
    assert flags.uid_gid == (65534, 65534) and flags.network_disabled
    writable = sandbox_flags(spec(limits=SandboxLimits(read_only=False)))
    assert [m.path for m in writable.tmpfs] == ["/tmp", WORKDIR, "/packages"], (
        "no read-only covers without --read-only"
    )
    assert flags.binds == ()


def test_the_three_renderers_say_the_same() -> None:
    s = spec()
    argv = CliRuntime("podman", "podman").create_argv(s)
    pairs = set(itertools.pairwise(argv))
    body = create_body(s)
    host = body["HostConfig"]
    pod = pod_manifest(s)
    (container,) = pod["spec"]["containers"]
    # memory and swap
    assert {("--memory", "300m"), ("--memory-swap", "300m")} <= pairs
    assert host["Memory"] == host["MemorySwap"] == size_bytes("300m")
    assert container["resources"]["limits"]["memory"] == "300Mi"
    # cpus
    assert ("--cpus", "0.25") in pairs and host["NanoCpus"] == 250_000_000
    assert container["resources"]["limits"]["cpu"] == "250m"
    # pids and ulimits (no Pod field: node settings)
    assert ("--pids-limit", "77") in pairs and host["PidsLimit"] == 77
    assert ("--ulimit", "nofile=555:555") in pairs
    assert {"Name": "nproc", "Soft": 666, "Hard": 666} in host["Ulimits"]
    # tmpfs: the same mounts, the Pod without the read-only covers
    cli_tmpfs = {
        b.split(":", 1)[0]: b.split(":", 1)[1] for a, b in itertools.pairwise(argv) if a == "--tmpfs"
    }
    assert cli_tmpfs == host["Tmpfs"]
    assert sorted(m["mountPath"] for m in container["volumeMounts"]) == ["/packages", "/tmp", WORKDIR]
    sizes = {v["emptyDir"]["sizeLimit"] for v in pod["spec"]["volumes"]}
    assert sizes == {"12Mi", "34Mi", "56Mi"}
    # the rest of the wall
    assert {
        ("--user", "65534:65534"),
        ("--network", "none"),
        ("--cap-drop", "ALL"),
        ("--log-driver", "none"),
    } <= pairs
    assert (body["User"], host["NetworkMode"], host["CapDrop"], host["LogConfig"]["Type"]) == (
        "65534:65534",
        "none",
        ["ALL"],
        "none",
    )
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert (
        "--read-only" in argv
        and host["ReadonlyRootfs"]
        and container["securityContext"]["readOnlyRootFilesystem"]
    )
    assert ("--pull", "never") in pairs and container["imagePullPolicy"] == "Never"
    assert (body["StdinOnce"], container["stdinOnce"]) == (True, True)


def test_mounts_are_read_only_nosuid_nodev_noexec_and_not_recursive_in_every_renderer(
    tmp_path: Path,
) -> None:
    data, notebook = tmp_path / "data", tmp_path / "notebook"
    data.mkdir()
    notebook.mkdir()
    s = spec(mounts=(Mount(data, "/data"),))
    argv = CliRuntime("podman", "podman").create_argv(s)
    assert ("--volume", f"{data}:/data:ro,nosuid,nodev,noexec,bind") in set(itertools.pairwise(argv))
    assert create_body(s)["HostConfig"]["Binds"] == [f"{data}:/data:ro,nosuid,nodev,noexec,bind"]
    pod = pod_manifest(s)
    (container,) = pod["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/data")
    assert mount["readOnly"] is True
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"] == {"path": str(data), "type": "Directory"}
    # A notebook's own directory on /workspace (the kernelspec) replaces the workspace tmpfs.
    on_workdir = sandbox_flags(spec(mounts=(Mount(notebook, WORKDIR),)))
    assert WORKDIR not in [m.path for m in on_workdir.tmpfs]
    assert [(b.target, b.options) for b in on_workdir.binds] == [(WORKDIR, BIND_OPTIONS)]


def test_docker_is_refused_a_mount_it_cannot_make_nosuid_nodev_noexec(tmp_path: Path) -> None:
    flags = sandbox_flags(spec(mounts=(Mount(tmp_path, "/data"),)))
    assert unsupported("podman", flags) is None
    assert "nosuid,nodev,noexec" in (unsupported("docker", flags) or "")
    assert unsupported("docker", sandbox_flags(spec())) is None

    async def create() -> None:
        runtime: Any = EngineRuntime(NoClient(), engine="docker")  # type: ignore[arg-type]
        await runtime.create(spec(mounts=(Mount(tmp_path, "/data"),)))

    with pytest.raises(RuntimeUnavailable, match="use podman for mounts"):
        anyio.run(create)


def test_a_durable_sandbox_is_labelled_and_keeps_stdin_once() -> None:
    s = spec(durable=True)
    assert s.all_labels()[DURABLE_LABEL] == "1" and DURABLE_LABEL not in spec().all_labels()
    assert sandbox_flags(s).stdin_once is True  # reached again through an exec session
    assert create_body(s)["StdinOnce"] is True and create_body(s)["OpenStdin"] is True
    container, handover = pod_manifest(s)["spec"]["containers"]  # a pod's is reached through its handover
    assert container["stdinOnce"] is True and container["stdin"] is True
    assert handover["name"] == "handover" and "stdin" not in handover


class NoClient:
    """Stands in for an engine client: a refused spec never reaches it."""

    endpoint = Endpoint("unix", path="/nonexistent.sock")
    engine = "podman"

    async def request(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("a refused spec reached the engine")


def test_the_cli_backend_refuses_a_durable_spec() -> None:
    """The CLI fallback keeps today's behaviour: sessions end with their bridge."""

    async def create() -> None:
        await CliRuntime("podman", "/nonexistent/podman").create(spec(durable=True))

    with pytest.raises(RuntimeUnavailable, match="engine API"):
        anyio.run(create)
