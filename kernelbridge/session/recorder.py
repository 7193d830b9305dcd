"""The session recorder: every iopub message of a session's kernel folded into cells as it arrives.

Another Jupyter client's cell exists only when the tunnel saw its signed ``execute_request``
(:meth:`kernelbridge.tunnel.core.Tunnel.take_client_execute`), and is journalled here when it ends;
the bridge's own cells are finished by the session. Nothing is queued, and it is bounded: at most
:data:`MAX_OPEN_CELLS` other clients' cells at once (the oldest dropped, never the bridge's), and
output under no known cell in one bounded buffer, reported once with the next result.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from kernelbridge.jupyter.client_env import real_username
from kernelbridge.session.cell import BoundedText, Cell, CellClient, DisplayEvent
from kernelbridge.session.outcome import BackgroundOutput
from kernelbridge.tunnel import ClientExecute

log = logging.getLogger(__name__)

MAX_OPEN_CELLS = 4
"""Other clients' cells tracked at once: ipykernel runs one cell at a time and a console sends one
at a time; each open cell may hold up to its output bounds. The bridge's own cells are never
dropped."""
BACKGROUND_CHARS = 4000
"""Characters of background output kept (head and tail) until the next result reports them."""
OUTPUT_TYPES = frozenset(
    {"stream", "display_data", "execute_result", "error", "clear_output", "update_display_data"}
)

ClientCellDone = Callable[[Cell], Awaitable[None]]
DisplayShown = Callable[[DisplayEvent, bool], Awaitable[None]]
"""Told every display event of a cell (and whether an open cell shows that display id): the
session's journal updates the earlier cells that show it."""
ClientExecutes = Callable[[str], ClientExecute | None]
"""``Sandbox.client_execute``: the verified execute_request of a msg_id, if a client sent one."""
CellRunning = Callable[[str, bool], None]
"""Told when a cell begins to be tracked (True) and when it ends or is dropped (False)."""


class Recorder:
    """Builds cells from a session's iopub; see the module docstring.

    ``client_execute`` tells which parents Jupyter clients really sent (None: no client cells at
    all, e.g. doctor's probe); ``on_client_cell`` journals another client's cell when it ends;
    ``on_running`` hears every cell, the bridge's and the clients', begin and end (the session's
    rpc broker admits host calls of running cells only); ``clock`` times the cells (the session
    runner's clock).
    """

    def __init__(
        self,
        output_limit: int,
        on_client_cell: ClientCellDone | None = None,
        *,
        client_execute: ClientExecutes | None = None,
        on_running: CellRunning | None = None,
        on_display: DisplayShown | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.output_limit = output_limit
        self.clock = clock
        self.on_client_cell = on_client_cell
        self.client_execute = client_execute
        self.on_running = on_running
        self.on_display = on_display
        self.unsent = 0
        """Messages announcing a cell (busy, execute_input) under a parent no client sent: ignored."""
        self.cells: collections.OrderedDict[str, Cell] = collections.OrderedDict()
        self.internal: set[str] = set()
        """msg_ids of the bridge's own silent requests (e.g. refreshing the mcp proxies)."""
        self.marks: dict[str, anyio.Event] = {}
        """Requests of the bridge's own whose idle marks a point in the iopub stream (:meth:`mark`)."""
        self.background = BoundedText(BACKGROUND_CHARS)
        self.background_displays = 0

    def expect(self, msg_id: str, code: str) -> Cell:
        """Track a cell the bridge is about to send (before sending: its first messages may
        arrive before the send returns)."""
        cell = Cell(msg_id, self.output_limit, source="mcp", code=code, clock=self.clock)
        self._track(cell)
        return cell

    def inherit(self, msg_id: str, code: str, *, running: bool) -> Cell:
        """Track a cell the bridge before this one sent, on an adopted sandbox's word (kernel code
        cannot make one up: see :class:`kernelbridge.tunnel.durable.InheritedCell`). Like the
        bridge's own cells, the session layer finishes and journals it; ``running``: the kernel
        is still on it (this bridge's cells wait behind it)."""
        cell = self.expect(msg_id, code)
        if running:
            cell.started = self.clock()
        return cell

    def _running(self, msg_id: str, running: bool) -> None:
        if self.on_running is not None:
            self.on_running(msg_id, running)

    def mark(self, msg_id: str) -> anyio.Event:
        """A request of the bridge's own, about to be sent, whose ``idle`` on iopub marks a point:
        the event is set once that idle has been heard, after every iopub message the kernel
        published before it (or when the sandbox ends: nothing more will come). Its messages are
        nobody's output."""
        event = self.marks[msg_id] = anyio.Event()
        return event

    def unmark(self, msg_id: str) -> None:
        self.marks.pop(msg_id, None)

    def ignore(self, msg_id: str) -> None:
        """A silent request of the bridge's own: its messages are nobody's output."""
        self.internal.add(msg_id)
        while len(self.internal) > MAX_OPEN_CELLS * 4:
            self.internal.pop()

    def forget(self, cell: Cell) -> None:
        """Stop tracking one of the bridge's cells (its call returned)."""
        if self.cells.pop(cell.msg_id, None) is not None:
            self._running(cell.msg_id, False)

    async def on_iopub(self, msg: dict[str, Any]) -> None:
        """The sandbox's listener: fold one iopub message into the cells."""
        header = msg.get("header") or {}
        parent = msg.get("parent_header") or {}
        if not isinstance(header, dict) or not isinstance(parent, dict):
            return
        msg_type = str(header.get("msg_type", ""))
        raw = msg.get("content")
        content: dict[str, Any] = raw if isinstance(raw, dict) else {}
        parent_id = parent.get("msg_id")
        if not isinstance(parent_id, str):
            return
        if parent_id in self.marks:
            if msg_type == "status" and content.get("execution_state") == "idle":
                self.marks.pop(parent_id).set()
            return
        if parent_id in self.internal:
            return
        cell = self.cells.get(parent_id)
        if (
            cell is None
            and parent.get("msg_type") == "execute_request"
            and msg_type in ("status", "execute_input")
        ):
            if msg_type == "status" and content.get("execution_state") != "busy":
                return
            cell = self._client_cell(parent_id)
        if cell is None:
            if msg_type in OUTPUT_TYPES:
                self._background(msg_type, content)
            return
        event = cell.on_iopub(msg_type, content)
        if event is not None:
            await self._display(cell, event)
        if cell.idle and cell.source != "mcp":
            self.cells.pop(parent_id, None)
            self._running(parent_id, False)
            if self.on_client_cell is not None:
                try:
                    await self.on_client_cell(cell)
                except Exception:
                    log.exception("journalling a client cell failed")

    def on_reply(self, msg: dict[str, Any]) -> None:
        """The sandbox's reply listener: an execute_reply completes one of the bridge's cells."""
        parent = msg.get("parent_header")
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        cell = self.cells.get(msg_id) if isinstance(msg_id, str) else None
        content = msg.get("content")
        if cell is not None and isinstance(content, dict):
            cell.on_reply(content)

    def busy_elsewhere(self, cell: Cell) -> bool:
        """Whether the kernel is running another cell (another client's) that began and has not
        ended: ``cell`` may wait behind it without its own clock running."""
        return any(c is not cell and c.started is not None and not c.idle for c in self.cells.values())

    def wake_all(self) -> None:
        """Wake every waiter (the sandbox ended: no more messages will come)."""
        for cell in self.cells.values():
            cell.notify()
        for heard in self.marks.values():
            heard.set()
        self.marks.clear()

    def take_background(self) -> BackgroundOutput | None:
        """A note about output that arrived outside any cell since the last call, or None."""
        if not self.background.total and not self.background_displays:
            return None
        note = BackgroundOutput(self.background.render("background output").strip(), self.background_displays)
        self.background = BoundedText(BACKGROUND_CHARS)
        self.background_displays = 0
        return note

    # -- internals ------------------------------------------------------------------------------
    def _client_cell(self, msg_id: str) -> Cell | None:
        """A cell for the execute_request ``msg_id`` if a Jupyter client really sent it, else None."""
        sent = self.client_execute(msg_id) if self.client_execute is not None else None
        if sent is None:
            self.unsent += 1
            if self.unsent in (1, 100) or self.unsent % 10_000 == 0:
                log.warning(
                    "recorder: ignored %d message(s) announcing a cell no client sent (forged)",
                    self.unsent,
                )
            return None
        cell = Cell(msg_id, self.output_limit, source="client", code=sent.code, clock=self.clock)
        cell.client = CellClient(real_username(sent.username), sent.session)
        self._track(cell)
        return cell

    def _track(self, cell: Cell) -> None:
        self.cells[cell.msg_id] = cell
        self._running(cell.msg_id, True)
        others = [c for c in self.cells.values() if c.source != "mcp"]
        for dropped in others[: max(len(others) - MAX_OPEN_CELLS, 0)]:  # the oldest first
            del self.cells[dropped.msg_id]
            self._running(dropped.msg_id, False)
            log.warning("recorder: stopped tracking cell %s (too many open cells)", dropped.msg_id[:8])

    async def _display(self, source: Cell, event: DisplayEvent) -> None:
        """A display id shown or updated by ``source``: every other open cell that shows it shows
        the new data too (as nbclient updates its whole notebook), and the journal hears of it."""
        shown = event.display_id in source.outputs.display_ids
        for cell in self.cells.values():
            if cell is not source:
                shown = cell.outputs.update_display(event) or shown
        if self.on_display is not None:
            try:
                await self.on_display(event, shown)
            except Exception:
                log.exception("journalling a display update failed")

    def _background(self, msg_type: str, content: dict[str, Any]) -> None:
        if msg_type == "stream":
            self.background.append(str(content.get("text", ""))[: BACKGROUND_CHARS * 2])
        elif msg_type in ("display_data", "execute_result", "update_display_data"):
            self.background_displays += 1
