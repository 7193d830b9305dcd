"""The engine backend against a stand-in client: its container listing under podman's listing
race, and how often it asks for the engine's info."""

from __future__ import annotations

from typing import Any

import pytest

from kernelbridge.errors import EngineRefused
from kernelbridge.runtime.engine.api import LIST_ATTEMPTS, EngineRuntime
from kernelbridge.runtime.engine.endpoint import parse_endpoint

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

    async def request(self, method: str, path: str, **kwargs: Any) -> Answer:
        self.calls += 1
        if self.calls <= self.failures:
            raise EngineRefused(self.message, 500, "Internal Server Error")
        return Answer()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


RACE = 'podman refused to list containers: getting container from store "1a89": container not known'


async def test_a_listing_during_removals_is_retried() -> None:
    client = FlakyClient(LIST_ATTEMPTS - 1, RACE)
    runtime = EngineRuntime(client, engine="podman")  # type: ignore[arg-type]
    (listed,) = await runtime.list()
    assert (listed.name, listed.labels) == ("kernelbridge-s1", ROW["Labels"])
    assert client.calls == LIST_ATTEMPTS


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
