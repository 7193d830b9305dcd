"""The engine backend against a stand-in client: its container listing under podman's listing
race, how it tells podman from docker, and how often it (and the CLI backend) asks for the
engine's info."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernelbridge.errors import EngineRefused
from kernelbridge.runtime import races
from kernelbridge.runtime.engine.api import EngineRuntime, open_engine
from kernelbridge.runtime.engine.endpoint import parse_endpoint
from kernelbridge.runtime.engine.transport import EngineResponse
from kernelbridge.runtime.races import ATTEMPTS as LIST_ATTEMPTS

pytestmark = pytest.mark.anyio

ROW = {
    "Id": "abc",
    "Names": ["/kernelbridge-s1"],
    "Labels": {"kernelbridge.session": "s1"},
    "State": "running",
}


class Answer:
    def json(self) -> Any:
        return [ROW]


class FlakyClient:
    """Refuses the first ``failures`` listings with ``message``, then answers."""

    def __init__(self, failures: int, message: str) -> None:
        self.failures, self.message, self.calls = failures, message, 0
        self.paths: list[str] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Answer:
        self.calls += 1
        self.paths.append(path)
        if self.calls <= self.failures:
            raise EngineRefused(self.message, 500, "Internal Server Error")
        return Answer()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retries' pauses are for a real engine's race to pass; a stand-in has none."""
    monkeypatch.setattr(races, "FIRST_DELAY", 0.0)


RACE = 'podman refused to list containers: getting container from store "1a89": container not known'


async def test_a_listing_during_removals_is_retried() -> None:
    client = FlakyClient(LIST_ATTEMPTS - 1, RACE)
    runtime = EngineRuntime(client, engine="podman")  # type: ignore[arg-type]
    (listed,) = await runtime.list()
    assert (listed.name, listed.labels) == ("kernelbridge-s1", ROW["Labels"])
    assert client.calls == LIST_ATTEMPTS
    # podman's own listing (what `podman ps` runs), which skips a container removed meanwhile.
    assert set(client.paths) == {"/libpod/containers/json"}


@pytest.mark.parametrize(
    "reason",
    [
        'getting container from store "1a89": container not known',
        "read /proc/18864/cgroup: no such process",
        "no container with ID 1a89 found in database: no such container",
    ],
)
async def test_each_way_podman_says_a_container_went_meanwhile_is_retried(reason: str) -> None:
    client = FlakyClient(2, f"the podman engine refused to list containers: {reason}")
    assert len(await EngineRuntime(client, engine="podman").list()) == 1  # type: ignore[arg-type]
    assert client.calls == 3


async def test_a_lasting_race_or_another_refusal_is_raised() -> None:
    with pytest.raises(EngineRefused, match="container not known"):
        await EngineRuntime(FlakyClient(LIST_ATTEMPTS, RACE), engine="podman").list()  # type: ignore[arg-type]
    other = FlakyClient(1, "podman refused to list containers: no space left on device")
    with pytest.raises(EngineRefused, match="no space"):
        await EngineRuntime(other, engine="podman").list()  # type: ignore[arg-type]
    assert other.calls == 1


ROOT_PODMAN_V2 = {
    "host": {
        "cgroupVersion": "v2",
        "cgroupControllers": ["cpu", "memory", "pids"],
        "security": {"rootless": False},
        "ociRuntime": {"name": "crun"},
    },
    "store": {"graphDriverName": "overlay"},
    "version": {"Version": "4.3.1"},
}
"""What podman's ``/libpod/info`` says on a root podman on cgroups v2 (the fields read)."""


class InfoClient:
    """Answers ``/libpod/info`` with ``libpod`` and docker's ``/info`` with ``facts``, counting
    the asks."""

    def __init__(self, libpod: dict[str, Any] = ROOT_PODMAN_V2, facts: dict[str, Any] | None = None) -> None:
        self.paths: list[str] = []
        self.endpoint = parse_endpoint("unix:///run/podman/podman.sock")
        self.libpod = libpod
        self.facts = facts or {}

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.paths.append(path)
        body = self.libpod if path == "/libpod/info" else self.facts

        class Info:
            def json(self) -> Any:
                return body

        return Info()


async def test_a_bridge_start_asks_the_engine_for_its_info_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbridge.runtime import info_store

    client = InfoClient()
    runtime = EngineRuntime(client, engine="podman")  # type: ignore[arg-type]
    clock = [100.0]
    monkeypatch.setattr(info_store.time, "monotonic", lambda: clock[0])
    first = await runtime.info()
    assert await runtime.info() == first and first.limits_enforced and not first.rootless
    assert (first.cgroup_version, first.oci_runtime, first.storage_driver, first.version) == (
        "v2",
        "crun",
        "overlay",
        "4.3.1",
    )
    # libpod's own info only: podman's compat /info costs the same package lookups again.
    assert client.paths == ["/libpod/info"]
    clock[0] += info_store.INFO_TTL  # later asks see a daemon changed meanwhile
    await runtime.info()
    assert client.paths == ["/libpod/info"] * 2


async def test_the_cli_backend_asks_podman_info_once_a_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """`podman info` is ~0.4 s and six dpkg-query runs: a kernelspec kernel's start asks twice."""
    from kernelbridge.runtime import info_store
    from kernelbridge.runtime.cli.backend import CliRuntime

    asked: list[tuple[str, ...]] = []

    class FakeCli:
        async def run(self, *args: str, **_: object) -> str:
            asked.append(args)
            if args == ("--version",):
                return "podman version 4.3.1\n"
            host = {"security": {"rootless": False}, "cgroupVersion": "v2", "ociRuntime": {"name": "runc"}}
            return json.dumps({"host": host, "store": {"graphDriverName": "overlay"}})

    runtime = CliRuntime()
    runtime.cli = FakeCli()  # type: ignore[assignment]
    clock = [100.0]
    monkeypatch.setattr(info_store.time, "monotonic", lambda: clock[0])
    first = await runtime.info()
    assert await runtime.info() == first
    assert (first.oci_runtime, first.storage_driver, first.limits_enforced) == ("runc", "overlay", True)
    assert len(asked) == 2  # --version and info, once
    clock[0] += info_store.INFO_TTL
    await runtime.info()
    assert len(asked) == 4


@pytest.mark.parametrize(
    ("host", "enforced"),
    [
        ({"cgroupVersion": "v1", "security": {"rootless": True}}, False),
        ({"cgroupVersion": "v2", "cgroupControllers": ["cpu"], "security": {"rootless": True}}, False),
        (
            {"cgroupVersion": "v2", "cgroupControllers": ["memory", "pids"], "security": {"rootless": True}},
            True,
        ),
        (
            {"cgroupVersion": "v1", "cgroupControllers": ["memory", "pids"], "security": {"rootless": False}},
            True,
        ),
    ],
)
async def test_podman_limits_are_enforced_only_with_its_memory_and_pids_controllers(
    host: dict[str, Any], enforced: bool
) -> None:
    info = await EngineRuntime(InfoClient({"host": host}), engine="podman").info()  # type: ignore[arg-type]
    assert (info.limits_enforced, info.rootless) == (enforced, host["security"]["rootless"])


async def test_docker_is_asked_its_compat_info() -> None:
    client = InfoClient(
        facts={"CgroupVersion": "2", "SecurityOptions": ["name=rootless"], "Driver": "overlay2"}
    )
    info = await EngineRuntime(client, engine="docker").info()  # type: ignore[arg-type]
    assert client.paths == ["/info"]
    assert (info.rootless, info.cgroup_version, info.limits_enforced, info.storage_driver) == (
        True,
        "v2",
        True,
        "overlay2",
    )


class PingClient:
    """Answers ``/_ping`` with ``headers`` and ``/version`` as docker does, recording the asks."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers, self.paths, self.engine = headers, [], "container"
        self.endpoint = parse_endpoint("unix:///run/engine.sock")

    async def request(self, method: str, path: str, **kwargs: Any) -> EngineResponse:
        self.paths.append(path)
        if path == "/_ping":
            return EngineResponse(200, b"OK", self.headers)
        return EngineResponse(200, b'{"Version": "27.5.1"}')


async def test_podman_is_told_by_its_ping_and_docker_by_its_version() -> None:
    podman = PingClient({"api-version": "1.41", "libpod-api-version": "4.3.1"})
    runtime = await open_engine(podman)  # type: ignore[arg-type]
    # podman's /version looks up its helpers' packages (~0.5 s): the ping says all that is needed.
    assert (runtime.engine, runtime.version, podman.paths) == ("podman", "4.3.1", ["/_ping"])
    docker = PingClient({"api-version": "1.47"})
    runtime = await open_engine(docker)  # type: ignore[arg-type]
    assert (runtime.engine, runtime.version, docker.paths) == ("docker", "27.5.1", ["/_ping", "/version"])
    assert docker.engine == "docker"
