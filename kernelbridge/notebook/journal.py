"""A session's journal: the append-only record of what ran, one JSON object per line.

One file per generation of a session: a header line, then one line per cell as soon as the cell
ends (one ``write`` each: a SIGKILLed bridge loses at most the cell in flight, and a reader in
another process sees whole lines or a torn last one), within a byte budget, then one ``truncated``
line and nothing more; never overwritten. Each line kind decodes once into a record
(:data:`JournalEntry`; :data:`DECODERS` maps a line's ``type`` to its decoder; the line formats:
docs/architecture.md, "The journal's lines"). Reading is bounded and untrusted
(:class:`JournalReader`): at most a given number of bytes, a line at a time; a line that is not a
record of a known type is skipped and counted, never a crash; fields of the wrong type read as
absent. This module knows no sessions, kernels or MCP.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from kernelbridge.config import Settings
from kernelbridge.notebook.access import SandboxAccess

log = logging.getLogger(__name__)

READ_SLACK = 64 * 1024
"""Bytes a reader takes past the budget: the ``truncated`` line (and a header) are written beyond it."""
BUDGET_SETTING = "KERNELBRIDGE_JOURNAL_BUDGET"

CellSource = Literal["mcp", "client"]
"""Who sent a cell: the bridge's own ``run_python`` or another Jupyter client of the kernel."""


@dataclass(slots=True)
class JournalHeader:
    """The first line of a journal."""

    session: str
    created: float
    owner_pid: int
    generation: int | None = None
    """Which generation of the session name this journal records (None: written before
    generations existed)."""
    access: SandboxAccess | None = None
    """The mounts and package policy its sandboxes had (None: not recorded, an older journal)."""

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "session", "session": self.session}
        if self.generation is not None:
            entry["generation"] = self.generation
        entry.update(created=self.created, owner_pid=self.owner_pid)
        if self.access is not None:
            entry["sandbox"] = self.access.to_json()
        return entry


@dataclass(slots=True)
class JournalCell:
    """One executed request and its (already bounded) outputs."""

    code: str
    source: CellSource = "mcp"
    execution_count: int | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """nbformat v4 output dicts (from the sandbox: checked again when they become a notebook)."""
    servers: list[str] = field(default_factory=list)
    """Host MCP servers granted to the session when the cell ran."""
    status: str | None = None
    """A :class:`~kernelbridge.session.outcome.Status` value (any string, when read back)."""
    duration_ms: int | None = None
    state: str | None = None
    started: float | None = None
    """Wall-clock time the cell began."""
    timeout: float | None = None
    """Seconds the call allowed (the bridge's own cells)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Host MCP calls the cell made, as :meth:`~kernelbridge.session.broker.ToolCallRecord.to_json`
    wrote them (read back as JSON objects: the replay checks each field it uses)."""
    client: dict[str, str] | None = None
    """``username`` and ``session`` of the Jupyter client that sent it (``source == "client"``)."""
    packages: list[dict[str, Any]] = field(default_factory=list)
    """``%pip install``s the cell made, as :meth:`~kernelbridge.packages.record.InstallRecord.to_json`
    wrote them (read back as JSON objects: ``records_of`` checks each field)."""
    display_ids: dict[str, list[int]] = field(default_factory=dict)
    """Display id -> indexes in :attr:`outputs` of the outputs that carry it (a later update of the
    id changes them: :class:`JournalDisplay`)."""

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "cell", "source": self.source}
        if self.client is not None:
            entry["client"] = self.client
        entry.update(
            code=self.code,
            execution_count=self.execution_count,
            outputs=self.outputs,
            servers=self.servers,
            status=self.status,
            duration_ms=self.duration_ms,
            state=self.state,
            started=self.started,
        )
        if self.source == "mcp" or self.tool_calls:
            entry["tool_calls"] = self.tool_calls
        if self.packages:
            entry["packages"] = self.packages
        if self.timeout is not None:
            entry["timeout"] = self.timeout
        if self.display_ids:
            entry["display_ids"] = self.display_ids
        return entry


@dataclass(slots=True)
class JournalDisplay:
    """Every output of an earlier cell with display id ``display_id`` shows this now."""

    display_id: str
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "display",
            "display_id": self.display_id,
            "data": self.data,
            "metadata": self.metadata,
            "at": self.at,
        }


@dataclass(slots=True)
class JournalTruncated:
    """Nothing of the session after this point is in the journal (or was read)."""

    budget: int | None = None
    """The writer reached its byte budget ..."""
    setting: str | None = None
    """... given by this setting."""
    at: float | None = None
    read_limit: int | None = None
    """The reader stopped after this many bytes (the file goes on)."""

    def to_json(self) -> dict[str, Any]:
        return {"type": "truncated", "budget": self.budget, "setting": self.setting, "at": self.at}


JournalEntry: TypeAlias = JournalHeader | JournalCell | JournalDisplay | JournalTruncated


class Journal:
    """Appends one session generation's entries to its JSON-lines file, within a byte budget.

    ``start`` creates the file (never an existing one: a journal is never overwritten) and
    writes the header; ``append`` writes one cell. Blocking: the session layer calls both in a
    worker thread. Raises OSError (the state directory is full or gone).
    """

    def __init__(self, path: Path, budget: int = 64 * 1024 * 1024, setting: str = BUDGET_SETTING) -> None:
        self.path = path
        self.budget = budget
        """Bytes this journal may hold (``KERNELBRIDGE_JOURNAL_BUDGET``, or what is left of the
        namespace's disk quota when that is less)."""
        self.setting = setting
        """The setting that gave the budget (said in the ``truncated`` record)."""
        self.cells = 0
        self.written = 0
        self.truncated = False
        """The budget was reached: one ``truncated`` line was written, and nothing will follow."""

    def start(self, header: JournalHeader) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write(header.to_json(), mode="x")

    def resume(self) -> bool:
        """Go on appending to the journal at :attr:`path`, written so far by another bridge (a
        session adopted with its sandbox): its cells, bytes and whether it was truncated are read
        back, one line at a time. A torn last line (that bridge was killed mid-write) is ended
        with a newline first, so it stays one unreadable line (skipped by readers) instead of
        spoiling the next cell. Returns whether it was torn. Raises OSError."""
        last = b"\n"
        with open(self.path, "rb") as f:
            for line in f:
                self.written += len(line)
                last = line[-1:]
                if not line.endswith(b"\n"):
                    continue  # torn: not a cell any reader can use
                if line.startswith(b'{"type": "cell"'):
                    self.cells += 1
                elif line.startswith(b'{"type": "truncated"'):
                    self.truncated = True
        torn = last != b"\n"
        if torn:
            with open(self.path, "ab") as f:
                f.write(b"\n")
            self.written += 1
        return torn

    def append(self, cell: JournalCell) -> bool:
        """Journal one cell; False when it did not fit (past the budget: nothing is written,
        except the one ``truncated`` line the first time)."""
        return self.append_line(encode_entry(cell.to_json()))

    def append_line(self, line: bytes) -> bool:
        """:meth:`append` of a cell already encoded (:func:`encode_entry`)."""
        written = self._write_line(line, mode="a")
        self.cells += written
        return written

    def append_record(self, record: JournalDisplay) -> bool:
        """Journal a record that is not a cell (same budget); False when it did not fit."""
        return self._write(record.to_json(), mode="a")

    def _write(self, entry: dict[str, Any], mode: Literal["x", "a"]) -> bool:
        return self._write_line(encode_entry(entry), mode)

    def _write_line(self, data: bytes, mode: Literal["x", "a"]) -> bool:
        if self.truncated:
            return False
        fits = mode == "x" or self.written + len(data) <= self.budget
        if not fits:
            self.truncated = True
            record = JournalTruncated(budget=self.budget, setting=self.setting, at=time.time())
            data = (json.dumps(record.to_json()) + "\n").encode()
        _append_bytes(self.path, data, exclusive=mode == "x")
        self.written += len(data)
        return fits


def _append_bytes(path: Path, data: bytes, *, exclusive: bool) -> None:
    """Write ``data`` at the end of ``path`` (created; ``exclusive``: never an existing file).
    The bare system calls: a cell's line costs an open, a write and a close, not the half dozen
    more (and the buffer) of a file object. Raises OSError."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else 0)
    fd = os.open(path, flags, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def encode_entry(entry: dict[str, Any]) -> bytes:
    """One journal line."""
    return (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8", errors="replace")


class JournalReader:
    """The entries of a journal file, one line in memory at a time (iterate it once).

    Past ``max_bytes`` it stops with a :class:`JournalTruncated` saying so (a journal of an older
    bridge, or of one with a bigger budget). Lines that cannot be read are skipped and counted in
    :attr:`skipped`, records of types this version does not know in :attr:`unknown`; each count
    is said in one line when the reading ends. :meth:`with_offsets` also gives each entry's byte
    offset in the file (where :func:`read_entry_at` finds it again). Raises OSError (opening the
    file)."""

    def __init__(self, path: Path, max_bytes: int | None = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.skipped = 0
        """Lines that were not a journal entry."""
        self.unknown = 0
        """Records of a type this version does not read."""

    def __iter__(self) -> Iterator[JournalEntry]:
        return (entry for _, entry in self.with_offsets())

    def with_offsets(self) -> Iterator[tuple[int, JournalEntry]]:
        limit = self.max_bytes if self.max_bytes is not None else -1
        read = 0
        try:
            with open(self.path, "rb") as f:
                while True:
                    line = f.readline(limit - read + 1 if limit >= 0 else -1)
                    offset, read = read, read + len(line)
                    if limit >= 0 and read > limit:
                        yield offset, JournalTruncated(read_limit=limit)
                        return
                    if not line:
                        return
                    entry = decode_entry(line)
                    if isinstance(entry, JournalEntry):
                        yield offset, entry
                    elif entry is UNKNOWN:
                        self.unknown += 1
                    else:
                        self.skipped += 1
        finally:
            if self.skipped:
                log.warning(
                    "journal %s: skipped %d line(s) that were not entries (torn or edited by hand)",
                    self.path.name,
                    self.skipped,
                )
            if self.unknown:
                log.warning(
                    "journal %s: skipped %d record(s) of a kind this version does not read",
                    self.path.name,
                    self.unknown,
                )


def entries_mentioning(path: Path, needle: bytes, max_bytes: int) -> Iterator[tuple[int, JournalEntry]]:
    """The entries (with their offsets) of the lines of a journal that contain ``needle``, within
    ``max_bytes``; the other lines are not decoded, and nothing is counted or said (a first pass
    before a :class:`JournalReader` reads the same file). Raises OSError (opening the file)."""
    read = 0
    with open(path, "rb") as f:
        while read <= max_bytes and (line := f.readline(max_bytes - read + 1)):
            offset, read = read, read + len(line)
            if read <= max_bytes and needle in line:
                entry = decode_entry(line)
                if isinstance(entry, JournalEntry):
                    yield offset, entry


def read_entry_at(path: Path, offset: int, max_bytes: int) -> JournalEntry | None:
    """The entry of the line at ``offset`` of a journal (at most ``max_bytes`` of it), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            entry = decode_entry(f.readline(max_bytes + 1))
    except OSError:
        return None
    return entry if isinstance(entry, JournalEntry) else None


class _Unknown:
    """A record of a type this version does not read (see :data:`DECODERS`)."""


UNKNOWN = _Unknown()
Decoder: TypeAlias = Callable[[dict[str, Any]], JournalEntry | None]


def decode_entry(line: bytes | str) -> JournalEntry | _Unknown | None:
    """One journal line as its record; :data:`UNKNOWN` for a record of a type this version does
    not know; None if it is no record (see the module docstring)."""
    try:
        raw = json.loads(line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    kind = raw.get("type")
    decoder = DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        return UNKNOWN if isinstance(kind, str) and kind else None
    return decoder(raw)


def _decode_header(raw: dict[str, Any]) -> JournalHeader:
    return JournalHeader(
        session=_str(raw.get("session")) or "",
        created=_number(raw.get("created")) or 0.0,
        owner_pid=_count(raw.get("owner_pid")) or 0,
        generation=_count(raw.get("generation")),
        access=SandboxAccess.from_json(raw.get("sandbox")),
    )


def _decode_truncated(raw: dict[str, Any]) -> JournalTruncated:
    return JournalTruncated(
        budget=_count(raw.get("budget")),
        setting=_str(raw.get("setting")),
        at=_number(raw.get("at")),
        read_limit=_count(raw.get("read_limit")),
    )


def _decode_display(raw: dict[str, Any]) -> JournalDisplay | None:
    display_id, data, metadata = raw.get("display_id"), raw.get("data"), raw.get("metadata")
    if not isinstance(display_id, str) or not display_id or not isinstance(data, dict):
        return None
    return JournalDisplay(
        display_id=display_id,
        data=data,
        metadata=metadata if isinstance(metadata, dict) else {},
        at=_number(raw.get("at")),
    )


def _display_ids(value: object) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        return {}
    found: dict[str, list[int]] = {}
    for key, indexes in value.items():
        if isinstance(key, str) and key and isinstance(indexes, list):
            kept = [i for i in indexes if _count(i) is not None]
            if kept:
                found[key] = kept
    return found


def _decode_cell(raw: dict[str, Any]) -> JournalCell | None:
    code = raw.get("code", "")
    if not isinstance(code, str):
        return None
    client = raw.get("client")
    outputs, servers, calls = raw.get("outputs"), raw.get("servers"), raw.get("tool_calls")
    packages = raw.get("packages")
    return JournalCell(
        code=code,
        source="client" if raw.get("source") == "client" else "mcp",
        execution_count=_count(raw.get("execution_count")),
        outputs=[o for o in outputs if isinstance(o, dict)] if isinstance(outputs, list) else [],
        servers=[s for s in servers if isinstance(s, str)] if isinstance(servers, list) else [],
        status=_str(raw.get("status")),
        duration_ms=_count(raw.get("duration_ms")),
        state=_str(raw.get("state")),
        started=_number(raw.get("started")),
        timeout=_number(raw.get("timeout")),
        tool_calls=[c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else [],
        client={str(k): str(v) for k, v in client.items()} if isinstance(client, dict) and client else None,
        packages=[p for p in packages if isinstance(p, dict)] if isinstance(packages, list) else [],
        display_ids=_display_ids(raw.get("display_ids")),
    )


DECODERS: dict[str, Decoder] = {
    "session": _decode_header,
    "cell": _decode_cell,
    "display": _decode_display,
    "truncated": _decode_truncated,
}
"""A record's ``type`` -> its decoder (a function of the parsed line: the record, or None when the
line is not a valid one of its type)."""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: object) -> float | None:
    """A JSON number as it was written (an int stays an int: ``timeout: 2`` is read back as 2)."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def journal_read_limit(settings: Settings) -> int:
    """Bytes of one journal that readers (export, restore, outputs) take at most."""
    return settings.journal_budget + READ_SLACK
