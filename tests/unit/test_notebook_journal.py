"""What the journal records for replay: each call's timeout, other clients' tool calls, and no
cells for a client's silent requests."""

from __future__ import annotations

from pathlib import Path

from kernelbridge.notebook.journal import Journal, journal_path, journal_to_notebook, read_journal
from kernelbridge.session.cell import Cell, CellResult


def client_cell(code: str | None) -> Cell:
    cell = Cell("m" * 32, 1000, source="client")
    cell.client = {"username": "person", "session": "s1"}
    cell.on_iopub("status", {"execution_state": "busy"})
    if code is not None:
        cell.on_iopub("execute_input", {"code": code, "execution_count": 7})
        cell.on_iopub("stream", {"name": "stdout", "text": "hi\n"})
    cell.on_iopub("status", {"execution_state": "idle"})
    return cell


def test_timeouts_client_tool_calls_and_silent_requests(tmp_path: Path) -> None:
    journal = Journal(journal_path(tmp_path, "s"), "s")
    journal.start()
    result = CellResult(status="timeout", session="s", execution_count=1, stdout="", stderr="", result=None,
                        error=None, truncated=False, duration_ms=2100, state="kept")  # fmt: skip
    journal.append("import time; time.sleep(9)", result, [], timeout=2)
    journal.append_client_cell(client_cell(None))  # silent: no execute_input, no cell
    call = {
        "server": "edge",
        "tool": "echo",
        "ok": True,
        "arguments": {"text": "a"},
        "result": {"isError": False},
    }
    journal.append_client_cell(client_cell("print('hi')"), [call])
    entries = [e for e in read_journal(journal.path) if e["type"] == "cell"]
    assert [e["source"] for e in entries] == ["mcp", "client"]
    nb = journal_to_notebook(read_journal(journal.path), "s")
    assert nb.cells[0].metadata.kernelbridge["timeout"] == 2
    assert nb.cells[1].metadata.kernelbridge["tool_calls"] == [call]
    assert nb.cells[1].metadata.kernelbridge["client"]["username"] == "person"
    assert nb.cells[1].outputs[0]["text"] == "hi\n" and nb.cells[1].execution_count == 7
