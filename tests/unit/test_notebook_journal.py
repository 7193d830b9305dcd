"""What the journal records for replay: each call's timeout, other clients' tool calls, and no
cells for a client's silent requests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelbridge.notebook.journal import Journal, JournalCell, JournalHeader
from kernelbridge.session.broker import ToolCallRecord
from kernelbridge.session.cell import Cell, CellClient, CellResult
from kernelbridge.session.outcome import State, Status
from kernelbridge.session.recording import client_entry, result_entry
from kernelbridge.testing.notebooks import journal_to_notebook, read_journal


def client_cell(code: str | None) -> Cell:
    cell = Cell("m" * 32, 1000, source="client")
    cell.client = CellClient("person", "s1")
    cell.on_iopub("status", {"execution_state": "busy"})
    if code is not None:
        cell.on_iopub("execute_input", {"code": code, "execution_count": 7})
        cell.on_iopub("stream", {"name": "stdout", "text": "hi\n"})
    cell.on_iopub("status", {"execution_state": "idle"})
    return cell


def test_timeouts_client_tool_calls_and_silent_requests(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "1.journal.jsonl")
    journal.start(JournalHeader("s", 0.0, os.getpid(), 1))
    result = CellResult(status=Status.TIMEOUT, session="s", execution_count=1, stdout="", stderr="",
                        result=None, error=None, truncated=False, duration_ms=2100,
                        state=State.KEPT)  # fmt: skip
    journal.append(result_entry("import time; time.sleep(9)", result, [], timeout=2))
    assert client_entry(client_cell(None), []) is None  # silent: no execute_input, no cell
    call = ToolCallRecord("edge", "echo", ok=True, duration_ms=3, error=None, arguments={"text": "a"},
                          result={"isError": False})  # fmt: skip
    entry = client_entry(client_cell("print('hi')"), [call])
    assert entry is not None
    journal.append(entry)
    entries = [e for e in read_journal(journal.path) if isinstance(e, JournalCell)]
    assert [e.source for e in entries] == ["mcp", "client"]
    nb = journal_to_notebook(read_journal(journal.path), "s")
    assert nb.cells[0].metadata.kernelbridge["timeout"] == 2
    assert nb.cells[1].metadata.kernelbridge["tool_calls"] == [
        {"server": "edge", "tool": "echo", "ok": True, "duration_ms": 3, "error": None,
         "arguments": {"text": "a"}, "result": {"isError": False}}
    ]  # fmt: skip
    assert nb.cells[1].metadata.kernelbridge["client"]["username"] == "person"
    assert nb.cells[1].outputs[0]["text"] == "hi\n" and nb.cells[1].execution_count == 7


def test_a_journal_is_never_started_over_an_existing_file_and_appends_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "1.journal.jsonl"
    journal = Journal(path)
    journal.start(JournalHeader("s", 0.0, os.getpid(), 1))
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        Journal(path).start(JournalHeader("s", 1.0, os.getpid(), 1))
    assert path.read_bytes() == before
    path.chmod(0o600)
    result = CellResult(status=Status.OK, session="s", execution_count=1, stdout="é" * 70_000,
                        stderr="", result=None, error=None, truncated=False, duration_ms=1,
                        state=State.KEPT)  # fmt: skip
    assert journal.append(result_entry("print('é' * 70_000)", result, [], timeout=5))
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2 and lines[0] == before and lines[1].endswith(b"\n")
    assert journal.written == path.stat().st_size and journal.cells == 1
    assert path.stat().st_mode & 0o777 == 0o600, "an append keeps the file's mode"
