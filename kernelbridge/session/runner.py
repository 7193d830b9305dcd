"""One cell's run on a session's sandbox, and the timeout policy (docs/architecture.md, "Timeouts").

:class:`CellRunner` sends a :class:`~kernelbridge.session.cell.Cell` through a :class:`CellTarget`,
follows it to its end or its deadline and returns a :class:`Run`; every wait is bounded by the
deadline plus :data:`TIMEOUT_GRACE`. A cancelled call stops its cell first, except when the bridge
is ``leaving`` a durable sandbox behind: the cell runs on. All time comes from a :class:`Clock`
(virtual in tests/unit/test_session_runner.py). It knows nothing of session names, journals or MCP.

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from kernelbridge.errors import SandboxError
from kernelbridge.host.state import Death
from kernelbridge.session.cell import Cell
from kernelbridge.session.outcome import (
    ClosedWhileRunning,
    NeverStarted,
    Note,
    NotSent,
    SandboxDied,
    State,
    Status,
    Stop,
    TimedOut,
    Unresponsive,
    Waited,
)

log = logging.getLogger(__name__)

INTERRUPT_GRACE = 3.0
"""Seconds an interrupted cell gets to finish before the kernel is restarted."""
TIMEOUT_GRACE = 12.0
"""Bound on everything after a call's deadline (interrupt, grace, restart): a timeout=8 call
returns within 8 + 12 s whatever state the sandbox is in."""
TICK = 1.0
"""Longest wait between checks of a running cell (progress, the session being closed)."""
PROGRESS_EVERY = 2.0
"""Seconds between progress notifications of a long cell."""
WAITED_NOTE_MS = 1000
"""A cell that waited longer than this behind another client's cell says so."""

ProgressCallback = Callable[[float, str], Awaitable[None]]
"""Called with (seconds elapsed, latest output lines) while a cell runs."""


class Clock(Protocol):
    """Where the runner's time comes from."""

    def now(self) -> float:
        """Seconds, monotonic (the same clock the cells' timestamps use)."""
        ...

    async def wait(self, event: anyio.Event, deadline: float) -> None:
        """Until ``event`` is set or ``deadline`` (of :meth:`now`) passes."""
        ...

    def move_on_after(self, seconds: float) -> anyio.CancelScope:
        """A cancel scope that expires ``seconds`` from now."""
        ...


class SystemClock:
    """Monotonic time and anyio's own timeouts."""

    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: anyio.Event, deadline: float) -> None:
        with anyio.move_on_after(max(deadline - time.monotonic(), 0)):
            await event.wait()

    def move_on_after(self, seconds: float) -> anyio.CancelScope:
        return anyio.move_on_after(seconds)


SYSTEM_CLOCK = SystemClock()


class CellTarget(Protocol):
    """What the runner needs of the session's sandbox for one cell (the registry's seat)."""

    @property
    def alive(self) -> bool:
        """The sandbox takes requests."""
        ...

    @property
    def death(self) -> Death | None:
        """Why the sandbox ended by itself, once it has."""
        ...

    @property
    def closed(self) -> bool:
        """The session was closed meanwhile (its sandbox is being stopped)."""
        ...

    @property
    def leaving(self) -> bool:
        """The bridge is leaving and its sandbox runs on without it (durable): a call cancelled
        now leaves its cell running, for the next bridge to hear the end of."""
        ...

    def busy_elsewhere(self, cell: Cell) -> bool:
        """The kernel runs another client's cell that began and has not ended."""
        ...

    async def send(self, code: str, msg_id: str) -> None:
        """Send the execute request (its outputs reach ``cell``). Raises SandboxError."""
        ...

    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group; never waits."""
        ...

    async def restart(self, timeout: float) -> bool:
        """A new kernel in the same container; False if not ready within ``timeout``."""
        ...

    def cancel_calls(self, cell: str | None) -> None:
        """Cancel the host calls of ``cell`` (every call when None)."""
        ...

    def restarted(self) -> None:
        """The kernel was replaced in place (its proxies must be rebound)."""
        ...

    def discard(self) -> None:
        """Drop the sandbox now (it is closed in the background); the session has lost it."""
        ...


@dataclass(slots=True)
class Run:
    """How one cell's run ended."""

    status: Status
    state: State
    notes: list[Note] = field(default_factory=list)


OnCancel = Callable[[Run], Awaitable[object]]
"""Told, shielded, how a cancelled call's cell was left (to journal it) before the cancellation
goes on."""


class CellRunner:
    """Runs cells under the timeout policy (see the module docstring)."""

    def __init__(self, *, max_timeout: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.max_timeout = max_timeout
        """How long a cell may wait behind another client's cell before it begins."""
        self.clock = clock

    async def run(
        self,
        target: CellTarget,
        cell: Cell,
        code: str,
        timeout: float,
        *,
        began: float | None = None,
        on_progress: ProgressCallback | None = None,
        on_cancel: OnCancel | None = None,
    ) -> Run:
        """Send ``code`` as ``cell`` and follow it for ``timeout`` seconds of kernel time.

        ``began``: when the call began waiting for the kernel (before binding proxies, say);
        ``on_progress``: told every :data:`PROGRESS_EVERY` seconds. Cancelled, the cell is
        stopped first (shielded, within :data:`TIMEOUT_GRACE`) and ``on_cancel`` told; the
        cancellation then goes on. Never raises otherwise: a sandbox that fails is a :class:`Run`.
        """
        notes: list[Note] = []
        try:
            try:
                await target.send(code, cell.msg_id)
            except SandboxError as exc:
                return self._unreachable(target, str(exc), notes)
            return await self._follow(target, cell, timeout, notes, on_progress, began)
        except BaseException:
            with anyio.CancelScope(shield=True):
                state = State.KEPT
                if not cell.done and not target.closed and target.alive and not target.leaving:
                    state = (await self._stop_overrun(target, cell)).state
                if on_cancel is not None:
                    await on_cancel(Run(Status.CANCELLED, state, notes))
            raise

    async def _follow(
        self,
        target: CellTarget,
        cell: Cell,
        timeout: float,
        notes: list[Note],
        on_progress: ProgressCallback | None,
        began: float | None,
    ) -> Run:
        """Wait for the cell, reporting progress; apply the timeout policy."""
        clock = self.clock
        queue_deadline = cell.queued + self.max_timeout
        last_progress = clock.now()
        other_busy_until = began if began is not None else cell.queued
        while not cell.done:
            now = clock.now()
            if target.closed:
                notes.append(ClosedWhileRunning())
                return Run(Status.KERNEL_DIED, State.LOST, notes)
            if not target.alive:
                death = target.death
                if death is None:
                    notes.append(SandboxDied("the sandbox ended"))
                else:
                    notes.append(SandboxDied(death.reason, death.kind))
                return Run(Status.KERNEL_DIED, State.LOST, notes)
            if cell.started is not None:
                deadline = cell.started + timeout
            else:
                if target.busy_elsewhere(cell):
                    other_busy_until = now
                deadline = min(queue_deadline, other_busy_until + timeout)
            if now >= deadline:
                if cell.started is None and deadline < queue_deadline:
                    stop = await self._stop_overrun(target, cell)
                    notes.append(Unresponsive(timeout, stop))
                    return Run(Status.TIMEOUT, stop.state, notes)
                if cell.started is None:
                    notes.append(NeverStarted(self.max_timeout))
                    return Run(Status.TIMEOUT, State.KEPT, notes)
                stop = await self._stop_overrun(target, cell)
                notes.append(TimedOut(timeout, stop))
                return Run(Status.TIMEOUT, stop.state, notes)
            if on_progress is not None and now - last_progress >= PROGRESS_EVERY:
                last_progress = now
                await _report(on_progress, now - (cell.started or cell.queued), cell.outputs.progress_tail())
            await clock.wait(cell.change_event, min(deadline, now + TICK))
        if cell.waited_ms() > WAITED_NOTE_MS:
            notes.append(Waited(cell.waited_ms() / 1000))
        return Run(Status.OK, State.KEPT, notes)

    async def _stop_overrun(self, target: CellTarget, cell: Cell) -> Stop:
        """Interrupt a cell that overran; restart the kernel if that does not stop it; discard
        the sandbox if even that does not finish within TIMEOUT_GRACE."""
        clock = self.clock
        target.cancel_calls(cell.msg_id)
        with clock.move_on_after(TIMEOUT_GRACE):
            await target.interrupt()
            end = clock.now() + INTERRUPT_GRACE
            while not cell.done and target.alive and clock.now() < end:
                await clock.wait(cell.change_event, end)
            if cell.done:
                return Stop.INTERRUPTED
            target.cancel_calls(None)
            if await target.restart(TIMEOUT_GRACE):
                target.restarted()
                return Stop.RESTARTED
        log.warning("cell %s: the sandbox did not restart in time; discarding it", cell.msg_id[:8])
        target.discard()
        return Stop.DISCARDED

    @staticmethod
    def _unreachable(target: CellTarget, reason: str, notes: list[Note]) -> Run:
        """The sandbox did not take the cell: it died (the registry sees that), or its stdin is
        not drained (it is discarded)."""
        death = target.death
        if target.alive:
            target.discard()
        elif death is not None:
            reason = death.reason
        notes.append(NotSent(reason))
        return Run(Status.KERNEL_DIED, State.LOST, notes)


async def _report(on_progress: ProgressCallback, elapsed: float, tail: str) -> None:
    try:
        await on_progress(elapsed, tail)
    except Exception:
        log.debug("progress notification failed", exc_info=True)
