"""A session's journal, and its conversion to an nbformat v4 notebook.

The journal is the durable record of what ran in a session: one JSON object per line in
``<state_dir>/sessions/<name>.journal.jsonl``, appended after every ``run_python`` call. Living on
disk (not only in the bridge's memory) lets ``kernelbridge export`` turn the session of another,
still running bridge process into a notebook. Entries hold already-capped outputs (see
:mod:`kernelbridge.session.cell`), so a line stays bounded whatever the cell printed.

Line kinds::

    {"type": "session", "session": ..., "created": ..., "owner_pid": ...}   first line of a journal
    {"type": "cell", "source": "mcp", "code": ..., "execution_count": ..., "outputs": [...],
     "servers": [...], "status": ..., "duration_ms": ..., "state": ..., "started": ..., "timeout": ...,
     "tool_calls": [{"server", "tool", "ok", "duration_ms", "error", "arguments", "result"}]}
    {"type": "cell", "source": "client", "client": {"username", "session"}, "code": ...,
     "execution_count": ..., "outputs": [...], "status": ..., "duration_ms": ..., "started": ...,
     "tool_calls": [...]}
    {"type": "truncated", "budget": ..., "at": ...}   the byte budget was reached: nothing follows

Each line is written (one ``write``) as soon as its cell ends, so a bridge killed with SIGKILL
loses at most the cell in flight. ``timeout`` is the seconds the call allowed (a replay gives the
cell the same); ``tool_calls`` are what :mod:`kernelbridge.notebook.replay` answers from with
``--recorded-tools``. A journal holds at most ``Settings.journal_budget`` bytes
(``KERNELBRIDGE_JOURNAL_BUDGET``): the first line that would pass it is replaced by one
``truncated`` line, and nothing is written after that, whatever the session does.

``source`` says who sent the cell: the bridge's own ``run_python`` (``mcp``), or another
Jupyter client of the same kernel (``client``: a person in ``kernelbridge attach``, nbclient).

Reading is bounded too (:func:`iter_journal`: at most a given number of bytes, one line at a
time); :mod:`kernelbridge.notebook.export` writes notebooks one cell at a time from it.

This module does no MCP and knows no kernels; replay and diff build on :func:`read_journal`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import nbformat
from nbformat import v4

from kernelbridge.config import Settings
from kernelbridge.errors import SessionError
from kernelbridge.session.cell import Cell, CellResult

KERNELSPEC: dict[str, str] = {
    "name": "kernelbridge",
    "display_name": "Python 3 (kernelbridge sandbox)",
    "language": "python",
}
LANGUAGE_INFO: dict[str, str] = {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"}
READ_SLACK = 64 * 1024
"""Bytes a reader takes past the budget: the ``truncated`` line (and a header) are written beyond it."""


def journal_path(sessions_dir: Path, session: str) -> Path:
    return sessions_dir / f"{session}.journal.jsonl"


class Journal:
    """Appends a session's entries to its JSON-lines file.

    A new session (this process created it) starts its journal afresh: a name reused after
    ``close_session`` is a new sandbox, and mixing two sandboxes' cells in one notebook would
    make a replay lie. The previous journal is kept as ``<name>.journal.jsonl.prev``.
    """

    def __init__(
        self,
        path: Path,
        session: str,
        budget: int = 64 * 1024 * 1024,
        setting: str = "KERNELBRIDGE_JOURNAL_BUDGET",
    ) -> None:
        self.path = path
        self.session = session
        self.budget = budget
        """Bytes this journal may hold (``KERNELBRIDGE_JOURNAL_BUDGET``, or what is left of the
        namespace's disk quota when that is less)."""
        self.setting = setting
        """The setting that gave the budget (said in the ``truncated`` record)."""
        self.cells = 0
        self.written = 0
        self.truncated = False
        """The budget was reached: one ``truncated`` line was written, and nothing will follow."""

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            os.replace(self.path, self.path.with_name(self.path.name + ".prev"))
        header = {
            "type": "session",
            "session": self.session,
            "created": time.time(),
            "owner_pid": os.getpid(),
        }
        self._write(header, mode="w")

    def append(self, code: str, result: CellResult, servers: list[str], timeout: float | None = None) -> None:
        """Journal one of the bridge's own cells (``run_python``)."""
        entry = {
            "type": "cell",
            "source": "mcp",
            "code": code,
            "execution_count": result.execution_count,
            "outputs": result.outputs,
            "servers": list(servers),
            "status": result.status,
            "duration_ms": result.duration_ms,
            "state": result.state,
            "started": time.time() - result.duration_ms / 1000,
            "tool_calls": result.tool_calls,
        }
        if timeout is not None:
            entry["timeout"] = timeout
        self.cells += self._write(entry, mode="a")

    def append_client_cell(self, cell: Cell, tool_calls: list[dict[str, Any]] | None = None) -> None:
        """Journal a cell another Jupyter client ran in the session's kernel. A silent request
        (no ``execute_input``: a client's own bookkeeping, e.g. a completer's setup) is no cell."""
        if cell.code is None:
            return
        outputs = cell.outputs
        status = "error" if outputs.error is not None else "ok"
        entry = {
            "type": "cell",
            "source": "client",
            "client": cell.client,
            "code": cell.code or "",
            "execution_count": outputs.execution_count,
            "outputs": outputs.notebook_outputs(),
            "servers": [],
            "status": status,
            "duration_ms": cell.elapsed_ms(),
            "state": "kept",
            "started": cell.queued_wall,
        }
        if tool_calls:
            entry["tool_calls"] = tool_calls
        self.cells += self._write(entry, mode="a")

    def _write(self, entry: dict[str, Any], mode: str) -> bool:
        """Write one line; False (and nothing, or the one ``truncated`` line) past the budget."""
        if self.truncated:
            return False
        # One write() per line: a reader in another process sees whole lines or a torn last
        # line, which read_journal skips.
        data = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8", errors="replace")
        fits = mode == "w" or self.written + len(data) <= self.budget
        if not fits:
            self.truncated = True
            record = {"type": "truncated", "budget": self.budget, "setting": self.setting, "at": time.time()}
            data = (json.dumps(record) + "\n").encode()
        with open(self.path, mode + "b") as f:
            f.write(data)
        self.written = len(data) if mode == "w" else self.written + len(data)
        return fits


def read_journal(path: Path, max_bytes: int | None = None) -> list[dict[str, Any]]:
    """Entries of a journal file (see :func:`iter_journal`)."""
    return list(iter_journal(path, max_bytes))


def iter_journal(path: Path, max_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """Entries of a journal file, one line in memory at a time; unparsable lines (a write in
    progress) are skipped. Past ``max_bytes`` it stops with a ``truncated`` entry saying so (a
    journal of an older bridge, or of one with a bigger budget). Raises OSError."""
    limit = max_bytes if max_bytes is not None else -1
    read = 0
    with open(path, "rb") as f:
        while True:
            line = f.readline(limit - read + 1 if limit >= 0 else -1)
            read += len(line)
            if limit >= 0 and read > limit:
                yield {"type": "truncated", "read_limit": limit}
                return
            if not line:
                return
            try:
                entry = json.loads(line.decode("utf-8", errors="replace"))
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(entry, dict):
                yield entry


def _valid_count(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None


def _clean_output(output: dict[str, Any], count: int | None) -> nbformat.NotebookNode:
    """Fix up one output so nbformat accepts it (execute_result needs an int or null count)."""
    out = dict(output)
    if out.get("output_type") == "execute_result":
        out["execution_count"] = _valid_count(out.get("execution_count")) or count
    return nbformat.from_dict(out)


def notebook_outputs(outputs: list[Any], count: int | None) -> list[nbformat.NotebookNode]:
    """nbformat output nodes from journal (or :class:`CellResult`) outputs."""
    return [_clean_output(o, count) for o in outputs if isinstance(o, dict)]


def new_notebook(session: str) -> nbformat.NotebookNode:
    """An empty notebook of ``session`` with kernelbridge's kernelspec."""
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = dict(LANGUAGE_INFO)
    nb.metadata["kernelbridge"] = {"session": session}
    return nb


def entry_cell(entry: dict[str, Any]) -> nbformat.NotebookNode | None:
    """The notebook cell of one journal entry (valid under nbformat), or None (not a cell)."""
    if entry.get("type") == "truncated":
        if "read_limit" in entry:
            what = f"the journal continues past {entry['read_limit']:,} bytes, which is all that is read"
        else:
            what = f"the session's journal reached its budget of {entry.get('budget')} bytes"
        setting = str(entry.get("setting", "KERNELBRIDGE_JOURNAL_BUDGET"))[:60]
        text = (
            f"*kernelbridge: {what} (`{setting}`); the cells that ran after "
            "this point are not in this notebook.*"
        )
        return v4.new_markdown_cell(text, metadata={"kernelbridge": {"truncated": True}})
    if entry.get("type") != "cell":
        return None
    count = _valid_count(entry.get("execution_count"))
    cell = v4.new_code_cell(
        source=str(entry.get("code", "")),
        execution_count=count,
        outputs=notebook_outputs(entry.get("outputs") or [], count),
    )
    meta: dict[str, Any] = {
        "source": entry.get("source") or "mcp",
        "servers": list(entry.get("servers") or []),
        "status": entry.get("status"),
        "duration_ms": entry.get("duration_ms"),
        "state": entry.get("state"),
    }
    if entry.get("client"):
        meta["client"] = entry["client"]
    if entry.get("tool_calls"):
        meta["tool_calls"] = entry["tool_calls"]
    if isinstance(entry.get("timeout"), int | float):
        meta["timeout"] = entry["timeout"]
    cell.metadata["kernelbridge"] = meta
    return valid_cell(cell)


def journal_to_notebook(entries: Iterable[dict[str, Any]], session: str) -> nbformat.NotebookNode:
    """Build a notebook with one code cell per executed request, valid under nbformat.validate."""
    nb = new_notebook(session)
    nb.cells = [cell for cell in map(entry_cell, entries) if cell is not None]
    nbformat.validate(nb)
    return nb


def valid_cell(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``cell`` if nbformat accepts it; else the same cell with each unacceptable output replaced
    by a note, so one odd output (e.g. metadata nested too deeply) never makes a whole session
    unexportable."""
    probe = v4.new_notebook(cells=[cell])
    try:
        nbformat.validate(probe)
        return cell
    except (nbformat.ValidationError, RecursionError):
        pass
    kept = []
    for output in cell.outputs:
        try:
            nbformat.validate(v4.new_notebook(cells=[v4.new_code_cell(outputs=[output])]))
            kept.append(output)
        except (nbformat.ValidationError, RecursionError, ValueError, TypeError):
            kind = output.get("output_type", "unknown")
            note = f"[kernelbridge: a {kind} output could not be kept in the notebook]"
            kept.append(v4.new_output("stream", name="stderr", text=note + "\n"))
    cell.outputs = kept
    try:
        nbformat.validate(v4.new_notebook(cells=[cell]))
    except (nbformat.ValidationError, RecursionError):
        cell.metadata = {"kernelbridge": {"note": "metadata dropped: not valid in a notebook"}}
    return cell


def notebook_json(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb, version=4)


def load_session_notebook(
    sessions_dir: Path, session: str, max_bytes: int | None = None
) -> nbformat.NotebookNode:
    """The notebook of ``session``'s journal (at most ``max_bytes`` of it). Raises SessionError if
    it has none. Blocking, and its size in memory (see :mod:`kernelbridge.notebook.export` for the
    bounded ways)."""
    return journal_to_notebook(iter_journal(session_journal(sessions_dir, session), max_bytes), session)


def session_journal(sessions_dir: Path, session: str) -> Path:
    """The journal file of ``session``. Raises SessionError if it has none."""
    path = journal_path(sessions_dir, session)
    if not path.is_file():
        raise SessionError(f"no journal for session {session!r}: it has not run any code here")
    return path


def export_session(settings: Settings, session: str, path: Path | str) -> Path:
    """Write ``session``'s notebook to ``path`` (works for a session of another bridge process),
    one cell at a time. Raises SessionError if the session has no journal, OSError if ``path``
    cannot be written."""
    from kernelbridge.notebook.export import write_notebook

    target = Path(path).expanduser()
    journal = session_journal(settings.sessions_dir, session)
    with open(target, "w", encoding="utf-8") as out:
        write_notebook(iter_journal(journal, journal_read_limit(settings)), session, out)
    return target


MAX_COUNTED_FILES = 100_000
"""Files :func:`disk_use` looks at; past this many it answers "full" (fail closed): a namespace's
files are its sessions' journals, its exports and its saved tools, never this many honestly."""
FULL = 1 << 62


def disk_use(settings: Settings) -> int:
    """Bytes of disk the files of ``settings``' namespace take on the host (each file's size or
    its allocated blocks, whichever is more): everything below its state directory (journals old
    and live, exports, saved tools) and its export directory; :data:`FULL` past
    :data:`MAX_COUNTED_FILES` entries. Blocking."""
    total, seen = 0, 0
    pending = [settings.state_dir, *([settings.export_dir] if settings.export_dir else [])]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        seen += len(entries)
        if seen > MAX_COUNTED_FILES:
            return FULL
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    total += max(info.st_size, info.st_blocks * 512)
            except OSError:
                continue
    return total


def journal_read_limit(settings: Settings) -> int:
    """Bytes of one journal that readers (export, restore, outputs) take at most."""
    return settings.journal_budget + READ_SLACK
