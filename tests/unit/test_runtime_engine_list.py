"""The engine backend against a stand-in client: its container listing under podman's listing
race, and how often it asks for the engine's info."""

from __future__ import annotations

from typing import Any

import pytest

from kernelbridge.errors import EngineRefused
from kernelbridge.runtime import races
from kernelbridge.runtime.engine.api import EngineRuntime
from kernelbridge.runtime.engine.endpoint import parse_endpoint
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


class InfoClient:
    """Answers /info and /libpod/info (a root podman on cgroups v2), counting the asks."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.endpoint = parse_endpoint("unix:///run/podman/podman.sock")

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.paths.append(path)
        facts = {"CgroupVersion": "2", "ServerVersion": "4.3.1", "MemoryLimit": True, "PidsLimit": True}
        libpod = {"host": {"security": {"rootless": False}}}

        class Info:
            def json(self) -> Any:
                return facts if path == "/info" else libpod

        return Info()


async def test_a_bridge_start_asks_the_engine_for_its_info_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbridge.runtime.engine import api

    client = InfoClient()
    runtime = EngineRuntime(client, engine="podman")  # type: ignore[arg-type]
    clock = [100.0]
    monkeypatch.setattr(api.time, "monotonic", lambda: clock[0])
    first = await runtime.info()
    assert await runtime.info() == first and first.limits_enforced and not first.rootless
    assert client.paths == ["/info", "/libpod/info"]
    clock[0] += api.INFO_TTL  # later asks see a daemon changed meanwhile
    await runtime.info()
    assert client.paths == ["/info", "/libpod/info"] * 2
