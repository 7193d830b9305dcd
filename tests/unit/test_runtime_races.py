"""Removal and reaping against a stand-in engine client (beside the real engine's
tests/runtime/test_races.py): every container is tried whatever another one does, a container
another client removed meanwhile is removed, the reaper goes on past one it cannot remove, and an
inspection that met the container's process ending is asked again."""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import pytest
from pids import no_such_pid

from kernelbridge.errors import EngineRefused, RuntimeUnavailable
from kernelbridge.runtime import races, reap_orphans
from kernelbridge.runtime.base import ContainerState
from kernelbridge.runtime.cli.backend import CliRuntime
from kernelbridge.runtime.cli.images import CliImages
from kernelbridge.runtime.engine.api import EngineRuntime
from kernelbridge.runtime.engine.images import EngineImages
from kernelbridge.runtime.reaper import process_start

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pauses between attempts are for a real engine; a stand-in needs none."""
    monkeypatch.setattr(races, "FIRST_DELAY", 0.0)
    monkeypatch.setattr("kernelbridge.runtime.engine.api.REMOVE_RETRY_DELAY", 0.0)


@dataclass
class Answer:
    data: Any = None

    def json(self) -> Any:
        return self.data


@dataclass
class Engine:
    """A stand-in client: ``containers`` listed; ``stuck`` refuse removal for good; ``taken`` are
    removed by another client just as this one asks (every DELETE of ours fails with what podman
    says of a container whose removal is under way, and then it is gone)."""

    containers: list[str]
    stuck: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)
    deletes: list[str] = field(default_factory=list)
    owner: dict[str, str] = field(default_factory=dict)
    """The owner labels every container carries (default: a pid no process has)."""

    async def request(self, method: str, path: str, **kwargs: Any) -> Answer:
        name = path.split("/")[2] if path.startswith("/containers/") else ""
        if method == "GET" and path.endswith("/containers/json"):
            labels = {
                "kernelbridge.session": "s",
                "kernelbridge.owner": str(no_such_pid()),
                "kernelbridge.host": socket.gethostname(),
                **self.owner,
            }
            return Answer(
                [{"Id": c, "Names": [c], "Labels": labels, "State": "exited"} for c in self.containers]
            )
        if method == "DELETE":
            self.deletes.append(name)
            if name in self.stuck:
                raise EngineRefused(f"refused to remove {name}: device or resource busy", 500, "busy")
            if name in self.taken:  # the other client's removal, under way, answers for it
                if name in self.containers:
                    self.containers.remove(name)
                raise EngineRefused(
                    f"refused to remove {name}: container not known", 500, "container not known"
                )
            if name in self.containers:
                self.containers.remove(name)
                return Answer()
            raise EngineRefused(f"no such container {name}", 404, f"no such container: {name}")
        if method == "GET" and path.endswith("/json"):
            if name in self.containers:
                return Answer({"Id": name, "Name": name, "State": {"Status": "exited", "ExitCode": 0}})
            raise EngineRefused(f"no such container {name}", 404, f"no such container: {name}")
        raise AssertionError(f"unexpected {method} {path}")


def runtime_of(engine: Engine) -> EngineRuntime:
    return EngineRuntime(engine, engine="podman")  # type: ignore[arg-type]


async def test_a_container_another_client_removed_meanwhile_is_removed() -> None:
    engine = Engine(["a", "b"], taken={"a"})
    await runtime_of(engine).remove(["a", "b"])
    assert engine.containers == []


async def test_every_container_is_tried_and_what_is_kept_is_said_once() -> None:
    engine = Engine(["a", "b", "c"], stuck={"b"})
    with pytest.raises(RuntimeUnavailable, match="device or resource busy") as raised:
        await runtime_of(engine).remove(["a", "b", "c"])
    assert not isinstance(raised.value, BaseExceptionGroup)
    assert engine.containers == ["b"]
    engine.stuck.add("c")
    engine.containers.append("c")
    with pytest.raises(RuntimeUnavailable, match="2 of 2 containers were not removed"):
        await runtime_of(engine).remove(["b", "c"])


async def test_the_reaper_goes_on_past_a_container_it_cannot_remove(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(["a", "b", "c", "d"], stuck={"b"}, taken={"c"})
    with caplog.at_level(logging.WARNING, logger="kernelbridge.runtime.reaper"):
        removed = await reap_orphans(runtime_of(engine))
    assert (removed, engine.containers) == (3, ["b"])
    (said,) = [r.getMessage() for r in caplog.records]
    assert "could not remove the orphaned sandbox b" in said and "busy" in said


async def test_a_later_process_given_the_owners_pid_is_not_taken_for_it() -> None:
    """pids wrap (pid_max is 32768 here): the owner is its pid and its process's start time."""
    parent = os.getppid()
    live = {"kernelbridge.owner": str(parent), "kernelbridge.owner-start": str(process_start(parent))}
    kept = Engine(["a"], owner=live)
    assert await reap_orphans(runtime_of(kept)) == 0 and kept.containers == ["a"]
    reused = Engine(["a"], owner={**live, "kernelbridge.owner-start": str(process_start(parent) + 1)})
    assert await reap_orphans(runtime_of(reused)) == 1 and reused.containers == []
    unsaid = Engine(["a"], owner={"kernelbridge.owner": str(parent)})  # an older bridge's container
    assert await reap_orphans(runtime_of(unsaid)) == 0 and unsaid.containers == ["a"]


class ListingCli:
    """A stand-in CLI: its first ``images`` listing fails as podman 4.3's does when another
    client removes an image while it lists; ``image inspect`` answers for the images left."""

    engine = "podman"

    def __init__(self) -> None:
        self.listings = 0

    async def run(self, *args: str, timeout: float = 30.0) -> str:
        if args[0] == "images":
            self.listings += 1
            if self.listings == 1:
                raise RuntimeUnavailable(
                    '`podman images` failed: Error: retrieving label for image "9c60": reading image'
                    ' "9c60": locating image with ID "9c60": image not known'
                )
            return "sha256:aaaa\n"
        assert args[:2] == ("image", "inspect"), args
        return '[{"Id": "sha256:aaaa", "RepoTags": ["localhost/kept:1"], "Labels": {}}]'


class ListingEngine:
    """A stand-in engine client: its first ``/images/json`` fails as podman 4.3's does when
    another client removes an image while it lists (``failures`` sets how many do)."""

    engine = "podman"

    def __init__(self, failures: int = 1) -> None:
        self.failures = failures
        self.listings = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> Answer:
        assert (method, path) == ("GET", "/images/json"), (method, path)
        self.listings += 1
        if self.listings <= self.failures:
            reason = 'locating image with ID "9c60": image not known'
            raise EngineRefused(f"the podman engine refused to list images: {reason}", 500, reason)
        return Answer([{"Id": "sha256:aaaa", "RepoTags": ["localhost/kept:1"], "Labels": {}}])


async def test_an_image_listing_that_met_a_removal_is_asked_again() -> None:
    cli = ListingCli()
    found = await CliImages(cli).list()  # type: ignore[arg-type]
    assert [image.tags for image in found] == [("localhost/kept:1",)]
    assert cli.listings == 2
    engine = ListingEngine()
    found = await EngineImages(engine).list()  # type: ignore[arg-type]
    assert [image.tags for image in found] == [("localhost/kept:1",)]
    assert engine.listings == 2


async def test_an_image_listing_that_keeps_failing_still_fails() -> None:
    engine = ListingEngine(failures=races.ATTEMPTS)
    with pytest.raises(EngineRefused, match="image not known"):
        await EngineImages(engine).list()  # type: ignore[arg-type]
    assert engine.listings == races.ATTEMPTS


ENDED = "read /proc/29543/cgroup: no such process"
"""What podman 4.3 answers when it inspects a container whose process ends meanwhile (seen in CI,
inspecting a sandbox whose agent had just exited)."""
EXITED = {"Id": "c1", "Name": "/kernelbridge-c1", "State": {"Status": "exited", "ExitCode": 3}}


class InspectingCli:
    """A stand-in CLI whose first ``failures`` inspections fail with ``message``."""

    engine = "podman"

    def __init__(self, failures: int, message: str = f"`podman container` failed: Error: {ENDED}") -> None:
        self.failures, self.message, self.calls = failures, message, 0

    async def run(self, *args: str, timeout: float = 30.0) -> str:
        assert args[:2] == ("container", "inspect"), args
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeUnavailable(self.message)
        return json.dumps([EXITED])


class InspectingEngine:
    """A stand-in engine client whose first ``failures`` inspections fail with ``message``."""

    def __init__(self, failures: int, message: str = ENDED) -> None:
        self.failures, self.message, self.calls = failures, message, 0

    async def request(self, method: str, path: str, **kwargs: Any) -> Answer:
        assert (method, path) == ("GET", "/containers/c1/json"), (method, path)
        self.calls += 1
        if self.calls <= self.failures:
            raise EngineRefused(f"the podman engine refused to inspect c1: {self.message}", 500, self.message)
        return Answer(EXITED)


def cli_runtime(cli: InspectingCli) -> CliRuntime:
    runtime = CliRuntime(engine="podman", executable="podman")
    runtime.cli = cli  # type: ignore[assignment]
    return runtime


async def test_an_inspection_that_met_the_process_ending_is_asked_again() -> None:
    cli = InspectingCli(failures=2)
    info = await cli_runtime(cli).inspect("c1")
    assert info is not None and (info.state, info.exit_code) == (ContainerState.EXITED, 3)
    assert cli.calls == 3
    engine = InspectingEngine(failures=2)
    info = await EngineRuntime(engine, engine="podman").inspect("c1")  # type: ignore[arg-type]
    assert info is not None and (info.state, info.exit_code) == (ContainerState.EXITED, 3)
    assert engine.calls == 3


async def test_an_inspection_is_not_asked_again_for_a_missing_container_or_another_refusal() -> None:
    gone = InspectingCli(failures=1, message="`podman container` failed: Error: no such container c1")
    assert await cli_runtime(gone).inspect("c1") is None
    assert gone.calls == 1
    full = InspectingEngine(failures=1, message="no space left on device")
    with pytest.raises(EngineRefused, match="no space"):
        await EngineRuntime(full, engine="podman").inspect("c1")  # type: ignore[arg-type]
    assert full.calls == 1
    lasting = InspectingCli(failures=races.ATTEMPTS)
    with pytest.raises(RuntimeUnavailable, match="no such process"):
        await cli_runtime(lasting).inspect("c1")
    assert lasting.calls == races.ATTEMPTS
