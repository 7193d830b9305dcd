"""The timeout policy of the cell runner, driven with a fake clock and a scripted sandbox: no
kernel, no sleeping. Every figure asserted is virtual time, so each test is exact and takes
milliseconds; the same policy runs against real kernels in test_session_registry.py and
tests/integration/test_server*.py."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import pytest

from kernelbridge.errors import ExitKind, SandboxError
from kernelbridge.host import Death
from kernelbridge.session.cell import Cell
from kernelbridge.session.outcome import (
    ClosedWhileRunning,
    NeverStarted,
    NotSent,
    SandboxDied,
    State,
    Status,
    Stop,
    TimedOut,
    Unresponsive,
    Waited,
)
from kernelbridge.session.runner import (
    INTERRUPT_GRACE,
    PROGRESS_EVERY,
    TIMEOUT_GRACE,
    CellRunner,
    CellTarget,
    Run,
)

pytestmark = pytest.mark.anyio

MAX_TIMEOUT = 600.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeClock:
    """Virtual time for one waiter (the runner): each wait jumps straight to whatever comes
    first, the deadline, a scheduled action or a cancel scope's expiry, and runs what is due."""

    def __init__(self) -> None:
        self.time = 100.0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._scopes: list[tuple[float, anyio.CancelScope]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.time

    def call_at(self, at: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (at, next(self._order), action))

    def move_on_after(self, seconds: float) -> anyio.CancelScope:
        scope = anyio.CancelScope()
        self._scopes.append((self.time + seconds, scope))
        return scope

    async def wait(self, event: anyio.Event, deadline: float) -> None:
        await anyio.lowlevel.checkpoint()
        while not event.is_set() and self.time < deadline:
            expiries = [at for at, scope in self._scopes if not scope.cancel_called]
            step = min([deadline, *(t[0] for t in self._timers[:1]), *expiries])
            assert step < math.inf, "the runner would wait forever"
            self.time = max(self.time, step)
            while self._timers and self._timers[0][0] <= self.time:
                heapq.heappop(self._timers)[2]()
            for at, scope in self._scopes:
                if at <= self.time:
                    scope.cancel()
            await anyio.lowlevel.checkpoint()  # a cancelled scope's cancellation lands here

    async def sleep(self, seconds: float) -> None:
        await self.wait(anyio.Event(), self.time + seconds)


@dataclass
class FakeSandbox(CellTarget):
    """A scripted sandbox with one cell: when the kernel begins it, how long it runs, whether an
    interrupt stops it, how a restart goes. Records every verb the runner uses."""

    clock: FakeClock
    cell: Cell
    starts_after: float | None = 0.01
    """None: the kernel never begins the cell."""
    runs_for: float = 1.0
    obeys_interrupt: bool = True
    restart_seconds: float = 2.0
    restart_ok: bool = True
    busy_until: float = 0.0
    """Another client's cell holds the kernel until this (virtual) time."""
    send_error: str | None = None
    calls: list[str] = field(default_factory=list)
    dead: Death | None = None
    is_closed: bool = False

    @property
    def alive(self) -> bool:
        return self.dead is None and "discard" not in self.calls

    @property
    def death(self) -> Death | None:
        return self.dead

    @property
    def closed(self) -> bool:
        return self.is_closed

    def busy_elsewhere(self, cell: Cell) -> bool:
        return self.clock.now() < self.busy_until

    async def send(self, code: str, msg_id: str) -> None:
        self.calls.append("send")
        if self.send_error is not None:
            raise SandboxError(self.send_error)
        if self.starts_after is not None:
            begin = max(self.clock.now(), self.busy_until) + self.starts_after
            self.clock.call_at(begin, self._begin)

    def _begin(self) -> None:
        self.cell.on_iopub("status", {"execution_state": "busy"})
        self.cell.on_iopub("stream", {"name": "stdout", "text": "working\n"})
        if self.runs_for < math.inf:
            self.clock.call_at(self.clock.now() + self.runs_for, self._end)

    def _end(self, status: str = "ok") -> None:
        if not self.cell.done:
            self.cell.on_iopub("status", {"execution_state": "idle"})
            self.cell.on_reply({"status": status, "execution_count": 1})

    async def interrupt(self) -> None:
        self.calls.append("interrupt")
        if self.obeys_interrupt and self.cell.started is not None:
            self.clock.call_at(self.clock.now() + 0.1, lambda: self._end("error"))

    async def restart(self, timeout: float) -> bool:
        self.calls.append("restart")
        await self.clock.sleep(self.restart_seconds)
        return self.restart_ok

    def cancel_calls(self, cell: str | None) -> None:
        self.calls.append(f"cancel {'cell' if cell else 'all'}")

    def restarted(self) -> None:
        self.calls.append("restarted")

    def discard(self) -> None:
        self.calls.append("discard")

    def die_at(self, at: float, reason: str) -> None:
        def die() -> None:
            self.dead = Death(ExitKind.OOM, reason)
            self.cell.notify()  # the recorder wakes every cell when the sandbox ends

        self.clock.call_at(at, die)


def scripted(**script: object) -> tuple[FakeClock, FakeSandbox, CellRunner]:
    clock = FakeClock()
    cell = Cell("c" * 32, 1000, code="work()", clock=clock.now)
    sandbox = FakeSandbox(clock, cell, **script)  # type: ignore[arg-type]
    return clock, sandbox, CellRunner(max_timeout=MAX_TIMEOUT, clock=clock)


async def run(sandbox: FakeSandbox, runner: CellRunner, timeout: float = 10.0, **options: object) -> Run:
    with anyio.fail_after(5):  # real time: virtual time never sleeps
        return await runner.run(sandbox, sandbox.cell, "work()", timeout, **options)  # type: ignore[arg-type]


async def test_a_cell_that_ends_in_time_is_ok_and_nothing_is_stopped() -> None:
    clock, sandbox, runner = scripted(runs_for=3.0)
    start = clock.now()
    outcome = await run(sandbox, runner)
    assert outcome == Run(Status.OK, State.KEPT, [])
    assert sandbox.calls == ["send"] and clock.now() - start == pytest.approx(3.01)


async def test_an_overrun_is_interrupted_at_its_deadline_and_keeps_the_variables() -> None:
    clock, sandbox, runner = scripted(runs_for=math.inf)
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=8)
    assert outcome == Run(Status.TIMEOUT, State.KEPT, [TimedOut(8, Stop.INTERRUPTED)])
    assert sandbox.calls == ["send", "cancel cell", "interrupt"]
    assert clock.now() - start == pytest.approx(0.01 + 8 + 0.1)  # the deadline counts from busy


async def test_an_interrupt_ignored_past_the_grace_restarts_the_kernel() -> None:
    clock, sandbox, runner = scripted(runs_for=math.inf, obeys_interrupt=False, restart_seconds=2.0)
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=8)
    assert outcome == Run(Status.TIMEOUT, State.LOST, [TimedOut(8, Stop.RESTARTED)])
    assert sandbox.calls == ["send", "cancel cell", "interrupt", "cancel all", "restart", "restarted"]
    assert clock.now() - start == pytest.approx(0.01 + 8 + INTERRUPT_GRACE + 2.0)


async def test_a_restart_that_fails_discards_the_sandbox() -> None:
    _, sandbox, runner = scripted(runs_for=math.inf, obeys_interrupt=False, restart_ok=False)
    outcome = await run(sandbox, runner, timeout=8)
    assert outcome == Run(Status.TIMEOUT, State.LOST, [TimedOut(8, Stop.DISCARDED)])
    assert sandbox.calls[-2:] == ["restart", "discard"]


async def test_everything_after_the_deadline_is_bounded_by_the_grace() -> None:
    clock, sandbox, runner = scripted(runs_for=math.inf, obeys_interrupt=False, restart_seconds=3600.0)
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=8)
    assert outcome == Run(Status.TIMEOUT, State.LOST, [TimedOut(8, Stop.DISCARDED)])
    assert sandbox.calls[-2:] == ["restart", "discard"]
    assert clock.now() - start == pytest.approx(0.01 + 8 + TIMEOUT_GRACE)  # the restart was cut short


async def test_waiting_behind_another_clients_cell_does_not_count_and_is_said() -> None:
    clock, sandbox, runner = scripted(busy_until=100.0 + 50.0, runs_for=9.0)
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=10)
    assert outcome.status is Status.OK and outcome.state is State.KEPT
    (note,) = outcome.notes
    assert isinstance(note, Waited) and note.seconds == pytest.approx(50.01, abs=0.01)
    assert clock.now() - start == pytest.approx(50.01 + 9)


async def test_a_cell_queued_behind_another_longer_than_the_maximum_never_started() -> None:
    clock, sandbox, runner = scripted(busy_until=math.inf)
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=10)
    assert outcome == Run(Status.TIMEOUT, State.KEPT, [NeverStarted(MAX_TIMEOUT)])
    assert sandbox.calls == ["send"] and clock.now() - start == pytest.approx(MAX_TIMEOUT)


async def test_a_kernel_that_never_begins_the_cell_is_unresponsive_and_replaced() -> None:
    clock, sandbox, runner = scripted(starts_after=None)
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=10)
    assert outcome == Run(Status.TIMEOUT, State.LOST, [Unresponsive(10, Stop.RESTARTED)])
    assert clock.now() - start == pytest.approx(10 + INTERRUPT_GRACE + 2.0)


async def test_a_sandbox_that_dies_mid_cell_is_said_with_its_reason() -> None:
    clock, sandbox, runner = scripted(runs_for=math.inf)
    sandbox.die_at(clock.now() + 4, "out of memory")
    outcome = await run(sandbox, runner, timeout=10)
    assert outcome == Run(Status.KERNEL_DIED, State.LOST, [SandboxDied("out of memory", ExitKind.OOM)])
    assert "interrupt" not in sandbox.calls and "discard" not in sandbox.calls


async def test_a_cell_that_cannot_be_sent_discards_a_live_sandbox_and_names_a_dead_ones_death() -> None:
    _, sandbox, runner = scripted(send_error="its stdin is full")
    outcome = await run(sandbox, runner)
    assert outcome == Run(Status.KERNEL_DIED, State.LOST, [NotSent("its stdin is full")])
    assert sandbox.calls == ["send", "discard"]
    _, dead, runner = scripted(send_error="not running")
    dead.dead = Death(ExitKind.KERNEL_DIED, "the kernel exited (SIGSEGV)")
    outcome = await run(dead, runner)
    assert outcome.notes == [NotSent("the kernel exited (SIGSEGV)")] and "discard" not in dead.calls


async def test_a_session_closed_mid_cell_ends_the_wait_within_a_tick() -> None:
    clock, sandbox, runner = scripted(runs_for=math.inf)
    clock.call_at(clock.now() + 2.5, lambda: setattr(sandbox, "is_closed", True))
    start = clock.now()
    outcome = await run(sandbox, runner, timeout=30)
    assert outcome == Run(Status.KERNEL_DIED, State.LOST, [ClosedWhileRunning()])
    assert clock.now() - start <= 2.5 + 1.0  # TICK


async def test_a_cancelled_call_stops_its_cell_and_is_told_before_the_cancellation_goes_on() -> None:
    clock, sandbox, runner = scripted(runs_for=math.inf)
    told: list[Run] = []

    async def on_cancel(outcome: Run) -> None:
        told.append(outcome)

    with anyio.CancelScope() as caller:
        clock.call_at(clock.now() + 3, caller.cancel)  # the MCP client gives up after 3 s
        await run(sandbox, runner, timeout=60, on_cancel=on_cancel)
    assert caller.cancelled_caught
    assert told == [Run(Status.CANCELLED, State.KEPT, [])]
    assert sandbox.calls == ["send", "cancel cell", "interrupt"]  # stopped, so no call queues behind it


async def test_progress_is_reported_every_few_seconds_with_the_latest_output() -> None:
    _, sandbox, runner = scripted(runs_for=7.0)
    seen: list[tuple[float, str]] = []

    async def progress(elapsed: float, tail: str) -> None:
        seen.append((round(elapsed, 2), tail))

    await run(sandbox, runner, timeout=10, on_progress=progress)
    assert [tail for _, tail in seen] == ["working"] * len(seen) and len(seen) == int(7 // PROGRESS_EVERY)
    assert all(b - a >= PROGRESS_EVERY - 0.02 for (a, _), (b, _) in itertools.pairwise(seen))
