"""A session's journal, and its conversion to an nbformat v4 notebook.

The journal is the durable record of what ran in a session: one JSON object per line in
``<state_dir>/sessions/<name>.journal.jsonl``, appended after every ``run_python`` call. Living on
disk (not only in the bridge's memory) lets ``kernelbridge export`` turn the session of another,
still running bridge process into a notebook. Entries hold already-capped outputs (see
:mod:`kernelbridge.execution`), so a line stays bounded whatever the cell printed.

Line kinds::

    {"type": "session", "session": ..., "created": ..., "owner_pid": ...}   first line of a journal
    {"type": "cell", "source": "mcp", "code": ..., "execution_count": ..., "outputs": [...],
     "servers": [...], "status": ..., "duration_ms": ..., "state": ..., "started": ..., "timeout": ...,
     "tool_calls": [{"server", "tool", "ok", "duration_ms", "error", "arguments", "result"}]}
    {"type": "cell", "source": "client", "client": {"username", "session"}, "code": ...,
     "execution_count": ..., "outputs": [...], "status": ..., "duration_ms": ..., "started": ...,
     "tool_calls": [...]}

Each line is written (one ``write``) as soon as its cell ends, so a bridge killed with SIGKILL
loses at most the cell in flight. ``timeout`` is the seconds the call allowed (a replay gives the
cell the same); ``tool_calls`` are what :mod:`kernelbridge.replay` answers from with
``--recorded-tools``.

``source`` says who sent the cell: the bridge's own ``run_python`` (``mcp``), or another
Jupyter client of the same kernel (``client``: a person in ``kernelbridge attach``, nbclient).

This module does no MCP and knows no kernels; replay and diff build on :func:`read_journal`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import nbformat
from nbformat import v4

from kernelbridge.config import Settings
from kernelbridge.errors import SessionError
from kernelbridge.execution import Cell, CellResult

KERNELSPEC: dict[str, str] = {
    "name": "kernelbridge",
    "display_name": "Python 3 (kernelbridge sandbox)",
    "language": "python",
}
LANGUAGE_INFO: dict[str, str] = {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"}


def journal_path(sessions_dir: Path, session: str) -> Path:
    return sessions_dir / f"{session}.journal.jsonl"


class Journal:
    """Appends a session's entries to its JSON-lines file.

    A new session (this process created it) starts its journal afresh: a name reused after
    ``close_session`` is a new sandbox, and mixing two sandboxes' cells in one notebook would
    make a replay lie. The previous journal is kept as ``<name>.journal.jsonl.prev``.
    """

    def __init__(self, path: Path, session: str) -> None:
        self.path = path
        self.session = session
        self.cells = 0

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
        self._write(entry, mode="a")
        self.cells += 1

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
        self._write(entry, mode="a")
        self.cells += 1

    def _write(self, entry: dict[str, Any], mode: str) -> None:
        # One write() per line: a reader in another process sees whole lines or a torn last
        # line, which read_journal skips.
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with open(self.path, mode, encoding="utf-8") as f:
            f.write(line)


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Entries of a journal file; unparsable lines (a write in progress) are skipped."""
    entries: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


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


def journal_to_notebook(entries: list[dict[str, Any]], session: str) -> nbformat.NotebookNode:
    """Build a notebook with one code cell per executed request, valid under nbformat.validate."""
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = dict(LANGUAGE_INFO)
    nb.metadata["kernelbridge"] = {"session": session}
    for entry in entries:
        if entry.get("type") != "cell":
            continue
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
        nb.cells.append(valid_cell(cell))
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


def load_session_notebook(sessions_dir: Path, session: str) -> nbformat.NotebookNode:
    """The notebook of ``session``'s journal. Raises SessionError if it has none."""
    path = journal_path(sessions_dir, session)
    if not path.is_file():
        raise SessionError(f"no journal for session {session!r}: it has not run any code here")
    return journal_to_notebook(read_journal(path), session)


def export_session(settings: Settings, session: str, path: Path | str) -> Path:
    """Write ``session``'s notebook to ``path`` (works for a session of another bridge process).

    Raises SessionError if the session has no journal, OSError if ``path`` cannot be written.
    """
    nb = load_session_notebook(settings.sessions_dir, session)
    target = Path(path).expanduser()
    nbformat.write(nb, str(target), version=4)
    return target
