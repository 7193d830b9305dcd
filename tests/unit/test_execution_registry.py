"""The session registry over the local test-double runtime (the agent as a plain subprocess, no
podman): fast checks of the policy: ordering within a session, parallelism across sessions,
timeouts, cancellation, death, limits, idle reaping, the warm pool and session records. The same
behaviours are checked end to end through real sandboxes in tests/integration/test_server*.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import anyio
import pytest

from kernelbridge.config import Settings
from kernelbridge.errors import SessionError
from kernelbridge.notebook.journal import read_journal
from kernelbridge.runtime import ContainerSpec
from kernelbridge.session.registry import SessionRegistry, validate_session_name
from kernelbridge.testing import LocalProcessRuntime

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TrackingRuntime(LocalProcessRuntime):
    """The local test double, recording which sandboxes it started and removed."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []
        self.stopped = 0
        self.changed = anyio.Event()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_until(self, *, started: int = 0, stopped: int = 0) -> None:
        while len(self.started) < started or self.stopped < stopped:
            await self.changed.wait()

    async def create(self, spec: ContainerSpec) -> str:
        cid = await super().create(spec)
        self.started.append(spec.session)
        self._changed()
        return cid

    async def remove(self, containers: list[str]) -> None:
        known = [c for c in containers if c in self._containers]
        await super().remove(containers)
        self.stopped += len(known)
        if known:
            self._changed()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path, warm_pool=0, max_sessions=3)


@asynccontextmanager
async def open_registry(
    settings: Settings, runtime: TrackingRuntime | None = None
) -> AsyncIterator[SessionRegistry]:
    async with (
        runtime or TrackingRuntime() as backend,
        SessionRegistry(settings, backend, image="test-double", agent_hash=None) as registry,
    ):
        yield registry


@pytest.fixture
async def registry(settings: Settings) -> AsyncIterator[SessionRegistry]:
    async with open_registry(settings) as reg:
        yield reg


async def test_state_is_kept_and_calls_to_one_session_queue_in_order(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "order = []", timeout=10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(registry.run, "a", "import time; time.sleep(0.5); order.append(1)", timeout=10)
            )
            await anyio.sleep(0.05)  # let the first call take the lock
            tg.start_soon(partial(registry.run, "a", "order.append(2)", timeout=10))
        result = await registry.run("a", "order", timeout=10)
    assert result.result == "[1, 2]"


async def test_two_sessions_run_in_parallel(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:  # start both kernels first
            tg.start_soon(partial(registry.run, "a", "1", timeout=10))
            tg.start_soon(partial(registry.run, "b", "1", timeout=10))
        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(registry.run, "a", "import time; time.sleep(1)", timeout=10))
            tg.start_soon(partial(registry.run, "b", "import time; time.sleep(1)", timeout=10))
        elapsed = time.monotonic() - start
    assert elapsed < 1.8, elapsed


async def test_timeout_interrupts_and_keeps_state(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "x = 7", timeout=10)
        start = time.monotonic()
        result = await registry.run(
            "a", "print('before', flush=True)\nimport time; time.sleep(60)", timeout=1
        )
        assert time.monotonic() - start < 4
        assert (result.status, result.state, result.stdout) == ("timeout", "kept", "before\n")
        assert (await registry.run("a", "x", timeout=10)).result == "7"


async def test_cancelled_call_interrupts_the_cell_so_the_next_call_does_not_wait(
    registry: SessionRegistry,
) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "x = 1", timeout=10)
        with anyio.move_on_after(0.5):
            await registry.run("a", "import time; time.sleep(60)", timeout=120)
        start = time.monotonic()
        result = await registry.run("a", "x", timeout=10)
    assert result.result == "1" and time.monotonic() - start < 1
    statuses = [e.get("status") for e in read_journal(registry.journal_file("a")) if e["type"] == "cell"]
    assert statuses == ["ok", "cancelled", "ok"]


async def test_dead_kernel_is_reported_and_replaced(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "x = 1", timeout=10)
        died = await registry.run("a", "import os; os._exit(1)", timeout=10)
        assert (died.status, died.state) == ("kernel_died", "lost")
        fresh = await registry.run("a", "'x' in globals()", timeout=10)
    assert fresh.result == "False"
    assert any("started a fresh one" in note for note in fresh.notes)


async def test_max_sessions_and_bad_names(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        for name in ("a", "b", "c"):
            await registry.run(name, "1", timeout=10)
        with pytest.raises(SessionError, match="too many sessions"):
            await registry.run("d", "1", timeout=10)
        assert await registry.close("a")
        assert not await registry.close("a")
        await registry.run("d", "1", timeout=10)
    for bad in ["", "../x", ".hidden", "a/b", "x" * 65, "sp ace", 3]:
        with pytest.raises(SessionError, match="invalid session name"):
            validate_session_name(bad)


async def test_session_record_lives_while_the_session_does(
    registry: SessionRegistry, settings: Settings
) -> None:
    with anyio.fail_after(30):
        await registry.run("rec", "1", timeout=10)
        record_file = settings.sessions_dir / "rec.session.json"
        record = json.loads(record_file.read_text())
        assert record["name"] == "rec" and await anyio.Path(record["connection_file"]).exists()
        assert set(record) == {"name", "connection_file", "container", "owner_pid", "created"}
        await registry.close("rec")
    assert not record_file.exists()


async def test_idle_sessions_are_closed(settings: Settings) -> None:
    kernels = TrackingRuntime()
    async with open_registry(replace(settings, idle_timeout=0.5), kernels) as registry:
        with anyio.fail_after(30):
            await registry.run("a", "1", timeout=10)
            assert registry.describe()
            await kernels.wait_until(stopped=1)
            assert registry.describe() == []


async def test_warm_pool_serves_the_first_call(settings: Settings) -> None:
    kernels = TrackingRuntime()
    async with open_registry(replace(settings, warm_pool=1), kernels) as registry:
        with anyio.fail_after(30):
            result = await registry.run("a", "1 + 1", timeout=10)
            assert result.result == "2"
            assert kernels.started[0].startswith("warm-") and "a" not in kernels.started
            await kernels.wait_until(started=2)  # the pool refills in the background
