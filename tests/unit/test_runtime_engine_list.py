"""The engine backend's container listing against podman's listing race, with a stand-in client."""

from __future__ import annotations

from typing import Any

import pytest

from kernelbridge.errors import EngineRefused
from kernelbridge.runtime.engine.api import LIST_ATTEMPTS, EngineRuntime

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
