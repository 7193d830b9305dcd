"""One cell as a kernel's messages make it (:class:`Cell`), and its result (:class:`CellResult`).

A cell is done only when BOTH the iopub ``status: idle`` for its request and its shell
``execute_reply`` have arrived, as in nbclient: the reply can overtake the last outputs, and
``idle`` can arrive before the reply is read. It knows nothing of sessions, timeouts or MCP.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from kernelbridge.notebook.journal import CellSource
from kernelbridge.session.outcome import DisplaysDropped, Note, State, Status
from kernelbridge.session.outputs import (
    MAX_DISPLAYS,
    CellError,
    CellOutputs,
    DisplayEvent,
    bounded_error,
    compact_traceback,
)
from kernelbridge.session.text import BoundedText, cut_middle, strip_ansi

if TYPE_CHECKING:
    from kernelbridge.packages.record import InstallRecord
    from kernelbridge.session.broker import ToolCallRecord

MAX_CODE_CHARS = 1_000_000
"""Source of another client's cell kept for the journal (the bridge's own is capped on input)."""

REPLY_KEYS = ("status", "execution_count", "ename", "evalue", "traceback")


def bounded_reply(content: dict[str, Any], limit: int) -> dict[str, Any]:
    """The parts of an execute_reply the bridge uses, bounded (the rest is never kept)."""
    reply = {key: content[key] for key in REPLY_KEYS if key in content}
    if not isinstance(reply.get("status"), str):
        reply.pop("status", None)
    if reply.get("status") == "error" or "ename" in reply:
        error, raw = bounded_error(content, limit)
        reply.update(ename=error.ename, evalue=error.evalue, traceback=raw["traceback"])
    return reply


__all__ = [
    "MAX_DISPLAYS",
    "BoundedText",
    "Cell",
    "CellClient",
    "CellError",
    "CellOutputs",
    "CellResult",
    "DisplayEvent",
    "compact_traceback",
    "cut_middle",
    "finish_cell",
    "strip_ansi",
]


@dataclass(frozen=True, slots=True)
class CellClient:
    """Who sent another client's cell, as its verified execute request said."""

    username: str
    session: str


class Live(Protocol):
    """What a cell's waiter asks of the sandbox it runs in (a session's)."""

    @property
    def alive(self) -> bool: ...


class Cell:
    """One execute request as seen on iopub, whichever client sent it, with its shell reply when
    the bridge sent it. Fed by :class:`kernelbridge.session.recorder.Recorder`; awaited by the
    session's :class:`~kernelbridge.session.runner.CellRunner`.

    Times come from ``clock`` (monotonic seconds, the runner's clock): ``queued`` when the request
    was sent (or first seen), ``started`` when the kernel began it (``status: busy``),
    ``finished`` at ``status: idle``. A call's timeout counts from ``started``: time spent queued
    behind another client's cell is not the cell's.
    """

    def __init__(
        self,
        msg_id: str,
        limit: int,
        source: CellSource = "mcp",
        code: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.msg_id = msg_id
        self.source: CellSource = source
        self.code = code
        self.outputs = CellOutputs(limit)
        self._clock = clock
        self.queued = clock()
        self.queued_wall = time.time()
        self.started: float | None = None
        self.finished: float | None = None
        self.reply: dict[str, Any] | None = None
        self.client: CellClient | None = None
        """Who sent it, when it was not the bridge."""
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        state = "done" if self.done else "running" if self.started else "queued"
        return f"<Cell {self.msg_id[:8]} {self.source} {state}>"

    @property
    def idle(self) -> bool:
        return self.finished is not None

    @property
    def done(self) -> bool:
        """Complete, as nbclient defines it: idle on iopub AND the reply (if we wait for one)."""
        return self.idle and (self.source != "mcp" or self.reply is not None)

    def on_iopub(self, msg_type: str, content: dict[str, Any]) -> DisplayEvent | None:
        """Fold one iopub message whose parent is this cell's request; returns the display event
        other cells must see too, if it is one."""
        if msg_type != "status":
            if msg_type == "execute_input" and self.code is None:
                self.code = str(content.get("code", ""))[:MAX_CODE_CHARS]
            # An output wakes nobody: waiters wait for the cell to start or end (see change_event).
            return self.outputs.handle(msg_type, content)
        state = content.get("execution_state")
        if state == "busy" and self.started is None:
            self.started = self._clock()
            self.notify()
        elif state == "idle":
            self.started = self.started or self._clock()
            self.finished = self._clock()
            self.notify()
        return None

    def on_reply(self, content: dict[str, Any]) -> None:
        """The shell reply to this cell's request (the bridge's own cells)."""
        self.reply = bounded_reply(content, self.outputs.limit)
        count = content.get("execution_count")
        if isinstance(count, int):
            self.outputs.execution_count = count
        self.notify()

    def notify(self) -> None:
        """Wake whoever waits on :attr:`change_event`."""
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def change_event(self) -> anyio.Event:
        """Set at the next change of the cell's state: started, idle, replied, or its sandbox ended
        (an output is no change: a waiter that reports outputs looks at them on its own clock)."""
        return self._changed

    async def changed(self, deadline: float) -> None:
        """Wait until something about the cell changes or ``deadline`` (of the clock) passes."""
        event = self._changed
        with anyio.move_on_after(max(deadline - self._clock(), 0)):
            await event.wait()

    async def ended(self, timeout: float, sandbox: Live) -> bool:
        """Wait at most ``timeout`` for the cell to be done or ``sandbox`` to end (no more of its
        messages can come); whether either happened."""
        with anyio.move_on_after(max(timeout, 0.0)):
            while not self.done and sandbox.alive:
                await self.change_event.wait()
        return self.done or not sandbox.alive

    def elapsed_ms(self) -> int:
        """Milliseconds the kernel has spent on the cell (0 while it waits in the queue)."""
        if self.started is None:
            return 0
        return int(((self.finished or self._clock()) - self.started) * 1000)

    def waited_ms(self) -> int:
        """Milliseconds the cell waited behind other work before the kernel began it."""
        return int(((self.started or self._clock()) - self.queued) * 1000)


@dataclass(slots=True)
class CellResult:
    """What one ``run_python`` call produced; the server renders it, the journal records it."""

    status: Status
    session: str
    execution_count: int | None
    stdout: str
    stderr: str
    result: str | None
    error: CellError | None
    truncated: bool
    duration_ms: int
    state: State
    images: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    """Host MCP calls the cell made, for the journal and the notebook."""
    packages: list[InstallRecord] = field(default_factory=list)
    """``%pip install``s the cell made through the host, for the journal and a restore."""
    waited_ms: int = 0
    """Time the cell waited behind another client's cell before it started."""
    notes: list[Note] = field(default_factory=list)
    """What to tell about the session itself (a restart, a fresh kernel, dropped outputs)."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """nbformat outputs for the journal."""
    display_ids: dict[str, list[int]] = field(default_factory=dict)
    """Display id -> indexes in :attr:`outputs` of the outputs that carry it (for later updates)."""


def finish_cell(
    run: Cell, *, session: str, status: Status, state: State, notes: list[Note] | None = None
) -> CellResult:
    """Freeze a cell (complete or not) into a CellResult."""
    out = run.outputs
    error = out.error
    if out.execution_count is None and run.reply is not None:
        out.execution_count = run.reply.get("execution_count")
    if status is Status.OK and run.reply is not None and run.reply.get("status") in ("error", "aborted"):
        status = Status.ERROR
        if error is None:
            reply = run.reply
            error = CellError(
                str(reply.get("ename", "Aborted")),
                str(reply.get("evalue", "")),
                compact_traceback([str(t) for t in reply.get("traceback") or []]),
            )
    if status is Status.OK and error is not None:
        status = Status.ERROR
    notes = list(notes or [])
    if out.dropped_displays:
        notes.append(DisplaysDropped(out.dropped_displays, MAX_DISPLAYS))
    return CellResult(
        status=status,
        session=session,
        execution_count=out.execution_count,
        stdout=out.stream_text("stdout"),
        stderr=out.stream_text("stderr"),
        result=out.result,
        error=error,
        truncated=out.truncated,
        duration_ms=run.elapsed_ms(),
        state=state,
        images=out.images(),
        notes=notes,
        outputs=out.notebook_outputs(),
        display_ids={key: list(indexes) for key, indexes in out.display_ids.items()},
    )
