"""What a session writes down as it runs: its generation's journal, and what it says about it.

Each cell is one line, written in a worker thread when it ends, within :func:`journal_budget`.
Writing never stops a call: a failed write is logged and said once (:class:`JournalFailed`), a full
journal said once (:class:`JournalFull`). Updates of displays that journalled cells show are held,
the latest per id, and written as ``display`` records before the next cell's line, when the session
ends, or past :data:`MAX_PENDING_CHARS`; an update for an id no cell showed is logged once, dropped.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Sequence

import anyio

from kernelbridge.config import Settings
from kernelbridge.notebook.access import SandboxAccess
from kernelbridge.notebook.journal import (
    BUDGET_SETTING,
    Journal,
    JournalCell,
    JournalDisplay,
    JournalHeader,
    encode_entry,
)
from kernelbridge.packages.record import InstallRecord
from kernelbridge.session.broker import ToolCallRecord
from kernelbridge.session.cell import Cell, CellResult, DisplayEvent
from kernelbridge.session.outcome import JournalFailed, JournalFull, Note, State, Status
from kernelbridge.session.records import SessionRecord
from kernelbridge.session.store import SessionStore, disk_use

log = logging.getLogger(__name__)

QUOTA_SETTING = "KERNELBRIDGE_HTTP_DISK_QUOTA"
MAX_SHOWN_IDS = 10_000
"""Display ids of journalled cells remembered (the oldest forgotten first): updates of an id past
this are no longer written (its cell keeps what it showed)."""
INLINE_WRITE_BYTES = 64 * 1024
"""A journal line up to this size is appended from the event loop (an open, a write to the page
cache and a close: tens of microseconds, less than a worker thread's round trip); a larger one
(images, long output) in a worker thread."""
MAX_PENDING_CHARS = 16 * 1024 * 1024
"""Characters of display updates held before they are written (the weight of a cell's rich outputs)."""


async def journal_budget(settings: Settings) -> tuple[int, str]:
    """A new journal's budget in bytes and the setting that gives it: ``KERNELBRIDGE_JOURNAL_BUDGET``,
    or what is left of the namespace's disk quota (HTTP tokens) when that is less."""
    budget, setting = settings.journal_budget, BUDGET_SETTING
    if settings.disk_quota is not None:
        left = settings.disk_quota - await anyio.to_thread.run_sync(disk_use, settings)
        if left < budget:
            budget, setting = max(left, 0), QUOTA_SETTING
    return budget, setting


def result_entry(code: str, result: CellResult, servers: list[str], timeout: float | None) -> JournalCell:
    """The journal record of one of the bridge's own cells."""
    return JournalCell(
        code=code,
        source="mcp",
        execution_count=result.execution_count,
        outputs=result.outputs,
        servers=list(servers),
        status=result.status.value,
        duration_ms=result.duration_ms,
        state=result.state.value,
        started=time.time() - result.duration_ms / 1000,
        timeout=timeout,
        tool_calls=[call.to_json() for call in result.tool_calls],
        packages=[record.to_json() for record in result.packages],
        display_ids=result.display_ids,
    )


def client_entry(
    cell: Cell, tool_calls: list[ToolCallRecord], installs: Sequence[InstallRecord] = ()
) -> JournalCell | None:
    """The journal record of a cell another Jupyter client ran, or None for a silent request (no
    ``execute_input``: a client's own bookkeeping, e.g. a completer's setup)."""
    if cell.code is None:
        return None
    outputs = cell.outputs
    client = cell.client
    return JournalCell(
        code=cell.code,
        source="client",
        client={"username": client.username, "session": client.session} if client is not None else {},
        execution_count=outputs.execution_count,
        outputs=outputs.notebook_outputs(),
        status=(Status.ERROR if outputs.error is not None else Status.OK).value,
        duration_ms=cell.elapsed_ms(),
        state=State.KEPT.value,
        started=cell.queued_wall,
        tool_calls=[call.to_json() for call in tool_calls],
        packages=[record.to_json() for record in installs],
        display_ids={key: list(indexes) for key, indexes in outputs.display_ids.items()},
    )


class SessionJournal:
    """One session generation's journal (see the module docstring). ``later`` is the session's
    list of notes for its next result."""

    def __init__(
        self, journal: Journal | None, session: str, *, quota: int | None, later: list[Note]
    ) -> None:
        self._journal = journal
        """None: the generation could not be begun (said once); nothing is written."""
        self.session = session
        self._quota = quota
        self._later = later
        self._failed = False
        self._full = False
        self._shown: OrderedDict[str, None] = OrderedDict()
        """Display ids that journalled cells show."""
        self._pending: dict[str, DisplayEvent] = {}
        self._pending_chars = 0
        self._unshown = 0

    @classmethod
    async def begin(
        cls,
        store: SessionStore,
        session: str,
        budget: tuple[int, str],
        where: dict[str, str | None],
        *,
        quota: int | None,
        later: list[Note],
        secret: str | None = None,
        access: SandboxAccess | None = None,
    ) -> tuple[SessionJournal, SessionRecord | None]:
        """Begin a new generation of ``session`` in ``store`` (its record, saying ``where`` its
        sandbox is and keeping a durable sandbox's ``secret``, then its journal's header with the
        sandbox's ``access``) in a worker thread. A failure is logged and said once: the session goes on."""

        def begin() -> tuple[SessionRecord, Journal]:
            record = store.begin(
                session,
                connection_file=where.get("connection_file"),
                container=where.get("container"),
                container_id=where.get("container_id"),
                label=where.get("label"),
                secret=secret,
            )
            journal = Journal(store.journal_path(record), budget=budget[0], setting=budget[1])
            header = JournalHeader(session, record.created, os.getpid(), record.generation, access)
            try:
                journal.start(header)
            except OSError as exc:
                raise _Begun(record, exc) from None
            return record, journal

        recording = cls(None, session, quota=quota, later=later)
        try:
            record, recording._journal = await anyio.to_thread.run_sync(begin)
        except _Begun as begun:
            recording._failed_write(begun.error)
            return recording, begun.record
        except OSError as exc:
            recording._failed_write(exc)
            return recording, None
        return recording, record

    @classmethod
    async def resume(
        cls,
        store: SessionStore,
        record: SessionRecord,
        budget: tuple[int, str],
        *,
        quota: int | None,
        later: list[Note],
    ) -> tuple[SessionJournal, bool]:
        """Go on with ``record``'s journal (its sandbox was adopted: the generation continues).
        Returns it and whether its last line was torn (the bridge before died mid-write). A
        journal that cannot be read or written is said once, as with :meth:`begin`."""
        journal = Journal(store.journal_path(record), budget=budget[0], setting=budget[1])
        recording = cls(journal, record.session, quota=quota, later=later)
        try:
            torn = await anyio.to_thread.run_sync(journal.resume)
        except OSError as exc:
            recording._journal = None
            recording._failed_write(exc)
            return recording, False
        return recording, torn

    @property
    def cells(self) -> int:
        """Cells written so far."""
        return self._journal.cells if self._journal is not None else 0

    async def append_result(
        self, code: str, result: CellResult, servers: list[str], timeout: float | None
    ) -> list[Note]:
        """Journal one of the bridge's own cells; returns the notes for its result."""
        await self._append(result_entry(code, result, servers, timeout))
        full = self._full_note()
        return [full] if full is not None else []

    async def append_client(
        self, cell: Cell, tool_calls: list[ToolCallRecord], installs: Sequence[InstallRecord] = ()
    ) -> None:
        """Journal another client's cell (its notes go with the session's next result)."""
        entry = client_entry(cell, tool_calls, installs)
        if entry is None:
            return
        await self._append(entry)
        if (full := self._full_note()) is not None:
            self._later.append(full)

    async def on_display(self, event: DisplayEvent, open_cell_shows: bool) -> None:
        """A display event of a cell (the recorder's ``on_display``): held for the journalled cells
        that show its id (see the module docstring)."""
        if event.display_id not in self._shown:
            if not open_cell_shows:
                self._unshown += 1
                if self._unshown in (1, 1000):
                    log.info(
                        "session %s: %d display update(s) for ids no cell shows (ignored, as in Jupyter)",
                        self.session,
                        self._unshown,
                    )
            return
        old = self._pending.pop(event.display_id, None)
        self._pending_chars += event.size - (old.size if old is not None else 0)
        self._pending[event.display_id] = event
        if self._pending_chars > MAX_PENDING_CHARS:
            await self.flush()

    async def flush(self) -> None:
        """Write the display updates held so far (before a cell's line; when the session ends)."""
        pending, self._pending, self._pending_chars = self._pending, {}, 0
        if self._journal is None or not pending:
            return
        records = [JournalDisplay(e.display_id, e.data, e.metadata, at=time.time()) for e in pending.values()]

        def write() -> None:
            assert self._journal is not None
            for record in records:
                self._journal.append_record(record)

        try:
            await anyio.to_thread.run_sync(write)
        except OSError as exc:
            self._failed_write(exc)

    async def _append(self, entry: JournalCell) -> None:
        if self._journal is None:
            return
        await self.flush()
        line = encode_entry(entry.to_json())
        try:
            if len(line) <= INLINE_WRITE_BYTES:  # most cells: no worker-thread round trip per call
                written = self._journal.append_line(line)
            else:
                written = await anyio.to_thread.run_sync(self._journal.append_line, line)
        except OSError as exc:
            self._failed_write(exc)
            return
        if written:
            for display_id in entry.display_ids:
                self._shown[display_id] = None
                self._shown.move_to_end(display_id)
            while len(self._shown) > MAX_SHOWN_IDS:
                self._shown.popitem(last=False)

    def _full_note(self) -> JournalFull | None:
        """The note that the journal reached its budget, the first time only."""
        journal = self._journal
        if journal is None or not journal.truncated or self._full:
            return None
        self._full = True
        log.warning("session %s: its journal reached its budget of %d bytes", self.session, journal.budget)
        quota = self._quota if journal.setting == QUOTA_SETTING else None
        return JournalFull(journal.budget, journal.setting, quota)

    def _failed_write(self, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        log.warning("writing the journal of session %s failed: %s", self.session, reason)
        if not self._failed:
            self._failed = True
            self._later.append(JournalFailed(reason))


async def on_display(journal: SessionJournal | None, event: DisplayEvent | None, shown: bool) -> None:
    """A session's display event for its journal, if it has one (:meth:`SessionJournal.on_display`);
    None: the session ends, write what is held (:meth:`SessionJournal.flush`)."""
    if journal is not None:
        await (journal.on_display(event, shown) if event is not None else journal.flush())


class _Begun(Exception):
    """The generation's record was written but its journal could not be started."""

    def __init__(self, record: SessionRecord, error: OSError) -> None:
        super().__init__(str(error))
        self.record = record
        self.error = error
