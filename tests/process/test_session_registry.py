"""The session registry over the local test-double runtime (the agent as a plain subprocess, no
podman): fast checks of the policy: ordering within a session, parallelism across sessions,
timeouts, cancellation, death, limits, idle reaping, the warm pool, the session's state and its
records by generation. The timeout policy itself is tested with a fake clock in
test_session_runner.py; the same behaviours end to end through real sandboxes in
tests/integration/test_server*.py.
"""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from kernelbridge.config import Settings
from kernelbridge.errors import SandboxStartFailed, SessionError
from kernelbridge.notebook.journal import JournalCell, JournalHeader
from kernelbridge.runtime import ContainerSpec
from kernelbridge.session import SessionRegistry, SessionState, Status, validate_session_name
from kernelbridge.session.outcome import FreshSandbox, SandboxDied, State
from kernelbridge.session.store import SessionStore, live_sessions
from kernelbridge.testing import LocalProcessRuntime
from kernelbridge.testing.notebooks import read_journal

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
        spans: dict[str, tuple[float, float]] = {}

        async def sleep_in(name: str) -> None:
            code = "import time\nbegan = time.time()\ntime.sleep(1)\n(began, time.time())"
            spans[name] = ast.literal_eval((await registry.run(name, code, timeout=10)).result or "")

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleep_in, "a")
            tg.start_soon(sleep_in, "b")
    # The two cells ran at the same time (one after the other, they would not overlap at all).
    overlap = min(spans["a"][1], spans["b"][1]) - max(spans["a"][0], spans["b"][0])
    assert overlap > 0.5, spans


async def test_timeout_interrupts_and_keeps_state(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "x = 7", timeout=10)
        # Within the bound, so interrupted: the sleep would outlast it.
        result = await registry.run(
            "a", "print('before', flush=True)\nimport time; time.sleep(60)", timeout=1
        )
        assert (result.status, result.state, result.stdout) == (Status.TIMEOUT, State.KEPT, "before\n")
        assert (await registry.run("a", "x", timeout=10)).result == "7"


async def test_cancelled_call_interrupts_the_cell_so_the_next_call_does_not_wait(
    registry: SessionRegistry,
) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "x = 1", timeout=10)
        with anyio.move_on_after(0.5):
            await registry.run("a", "import time; time.sleep(60)", timeout=120)
        result = await registry.run("a", "x", timeout=10)  # within the bound: the sleep would outlast it
    assert result.result == "1"
    statuses = [e.status for e in read_journal(registry.journal_file("a")) if isinstance(e, JournalCell)]
    assert statuses == ["ok", "cancelled", "ok"]


async def test_dead_kernel_is_reported_and_replaced(registry: SessionRegistry) -> None:
    with anyio.fail_after(30):
        await registry.run("a", "x = 1", timeout=10)
        session = registry.session("a")
        assert session is not None and session.state is SessionState.IDLE
        died = await registry.run("a", "import os; os._exit(1)", timeout=10)
        assert (died.status, died.state) == (Status.KERNEL_DIED, State.LOST)
        (note,) = died.notes
        assert isinstance(note, SandboxDied) and note.reason
        assert session.state is SessionState.DEAD and repr(session) == "<Session 'a' dead>"
        assert registry.describe()[0]["state"] == "dead"
        fresh = await registry.run("a", "'x' in globals()", timeout=10)
    assert fresh.result == "False" and session.state is SessionState.IDLE
    # Both earlier cells are in the journal: the note offers the restore= that re-runs them.
    assert fresh.notes == [FreshSandbox(note.reason, 2, "kernelbridge://sessions/a@1/notebook")]
    # One generation: the fresh sandbox's cells go on in the same journal.
    entries = read_journal(registry.journal_file("a"))
    assert [type(e) for e in entries] == [JournalHeader, JournalCell, JournalCell, JournalCell]


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
        store = SessionStore(settings.state_dir)
        record = store.current("rec")
        assert record is not None and record.connection_file is not None
        assert (record.session, record.generation, record.namespace, record.ended) == ("rec", 1, "", None)
        assert await anyio.Path(record.connection_file).exists() and record.container and record.container_id
        assert (settings.sessions_dir / "rec" / "1.json").is_file() and record.live
        assert [r.listing()["name"] for r in live_sessions(settings.state_dir)] == ["rec"]
        await registry.close("rec")
    ended = store.current("rec")
    assert ended is not None and ended.ended is not None and ended.connection_file is None and not ended.live
    assert live_sessions(settings.state_dir) == []


async def test_a_reused_name_is_a_new_generation_and_no_journal_is_overwritten(
    registry: SessionRegistry, settings: Settings
) -> None:
    with anyio.fail_after(30):
        await registry.run("again", "first = 1", timeout=10)
        await registry.close("again")
        await registry.run("again", "second = 2", timeout=10)
        store = SessionStore(settings.state_dir)
        assert store.generations("again") == [1, 2]
        current = store.current("again")
        assert current is not None and current.generation == 2 and current.ended is None
        assert registry.journal_file("again") == settings.sessions_dir / "again" / "2.journal.jsonl"
    older = read_journal(settings.sessions_dir / "again" / "1.journal.jsonl")
    newer = read_journal(registry.journal_file("again"))
    assert [e.code for e in older if isinstance(e, JournalCell)] == ["first = 1"]
    assert [e.code for e in newer if isinstance(e, JournalCell)] == ["second = 2"]
    assert [e.generation for e in newer if isinstance(e, JournalHeader)] == [2]


async def test_idle_sessions_are_closed(settings: Settings) -> None:
    kernels = TrackingRuntime()
    async with open_registry(replace(settings, idle_timeout=0.5), kernels) as registry:
        with anyio.fail_after(30):
            await registry.run("a", "1", timeout=10)
            session = registry.session("a")
            assert registry.describe() and session is not None
            await kernels.wait_until(stopped=1)
            assert registry.describe() == [] and session.state is SessionState.CLOSED


async def test_warm_pool_serves_the_first_call(settings: Settings) -> None:
    kernels = TrackingRuntime()
    async with open_registry(replace(settings, warm_pool=1), kernels) as registry:
        with anyio.fail_after(30):
            result = await registry.run("a", "1 + 1", timeout=10)
            assert result.result == "2"
            assert kernels.started[0].startswith("warm-") and "a" not in kernels.started
            await kernels.wait_until(started=2)  # the pool refills in the background


async def test_an_engine_that_is_down_at_start_loses_no_durable_session(tmp_path: Path) -> None:
    from kernelbridge.errors import SessionError
    from kernelbridge.runtime.unavailable import UnavailableRuntime

    store = SessionStore(tmp_path)
    store.open()
    store.detach(store.begin("s", container="kb-s", container_id="c1", label="s", secret="a" * 64))
    down = UnavailableRuntime("the podman engine does not answer")
    settings = Settings(state_dir=tmp_path, warm_pool=0)  # no warm start against a dead engine
    async with SessionRegistry(settings, down, image="test-double", agent_hash=None) as registry:
        await registry.settle(10)
        with pytest.raises(SessionError, match="the container engine did not answer"):
            await registry.run("s", "1", timeout=5)
    kept = store.current("s")
    assert kept is not None and kept.ended is None and kept.adoptable, kept  # still adoptable later


class FailsItsFirstStart(TrackingRuntime):
    """The double, whose first sandbox fails to start (an engine's hiccup, a port taken)."""

    async def create(self, spec: ContainerSpec) -> str:
        if not self.started:
            self.started.append(spec.session)
            raise SandboxStartFailed("the engine failed it, once")
        return await super().create(spec)


async def test_a_lost_sandbox_is_said_even_when_the_fresh_one_first_fails_to_start(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.open()  # the sandbox a bridge before left is gone (the double has no such container)
    store.detach(store.begin("s", container="kb-s", container_id="local-gone", label="s", secret="a" * 64))
    settings = Settings(state_dir=tmp_path, warm_pool=0)
    async with open_registry(settings, FailsItsFirstStart()) as registry:
        await registry.settle(30)  # found lost at start; the fresh sandbox after it failed
        result = await registry.run("s", "1", timeout=30)
    assert result.status is Status.OK, result
    assert [note.code for note in result.notes] == ["sandbox_lost"], result.notes


async def test_a_registry_that_fails_to_open_leaves_nothing_entered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelbridge.session.durability import Durability

    async def broken(self: Durability, pool: object) -> None:
        raise RuntimeError("the warm pool's records are unreadable")

    monkeypatch.setattr(Durability, "adopt_warm", broken)
    settings = Settings(state_dir=tmp_path, warm_pool=0)
    with anyio.fail_after(10):  # a task group left entered would corrupt this scope's exit
        async with TrackingRuntime() as runtime:
            with pytest.raises(RuntimeError, match="unreadable"):
                async with SessionRegistry(settings, runtime, image="test-double", agent_hash=None):
                    pass
            await anyio.lowlevel.checkpoint()


async def test_an_error_in_the_body_reaches_the_caller_and_every_sandbox_is_closed(
    settings: Settings,
) -> None:
    runtime = TrackingRuntime()
    with pytest.raises(ValueError, match="the caller's own"):
        async with open_registry(replace(settings, durable=False), runtime) as registry:
            await registry.run("a", "1", timeout=10)
            raise ValueError("the caller's own")
    assert runtime.stopped == 1
