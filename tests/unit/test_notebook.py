"""The journal on disk and its notebook: valid nbformat, metadata, export from another process.
Where journals live (generations, records) is tested in test_session_store.py."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from kernelbridge.config import Settings
from kernelbridge.errors import SessionError
from kernelbridge.notebook.convert import KERNELSPEC
from kernelbridge.notebook.journal import Journal, JournalCell, JournalHeader, JournalReader
from kernelbridge.session.cell import CellError, CellResult
from kernelbridge.session.generations import export_session
from kernelbridge.session.outcome import State, Status
from kernelbridge.session.recording import result_entry
from kernelbridge.session.store import SessionStore
from kernelbridge.testing.notebooks import journal_to_notebook, read_journal


def result(**kw: object) -> CellResult:
    base: dict[str, object] = dict(
        status=Status.OK, session="s", execution_count=1, stdout="hi\n", stderr="", result="2",
        error=None, truncated=False, duration_ms=12, state=State.KEPT,
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "hi\n"},
            {"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {},
             "execution_count": 1},
        ],
    )  # fmt: skip
    base.update(kw)
    return CellResult(**base)  # type: ignore[arg-type]


def started(path: Path, session: str = "s") -> Journal:
    journal = Journal(path)
    journal.start(JournalHeader(session, 0.0, os.getpid(), 1))
    return journal


def test_journal_round_trips_into_a_valid_notebook(tmp_path: Path) -> None:
    journal = started(tmp_path / "1.journal.jsonl")
    journal.append(result_entry("print('hi')\n1+1", result(), [], None))
    error = CellError("ZeroDivisionError", "division by zero", "ZeroDivisionError: division by zero")
    failed = result(
        status=Status.ERROR, execution_count=2, error=error, result=None,
        outputs=[{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                  "traceback": ["ZeroDivisionError: division by zero"]}],
    )  # fmt: skip
    journal.append(result_entry("1/0", failed, ["time"], None))
    timed_out = result(status=Status.TIMEOUT, execution_count=None, state=State.LOST, outputs=[])
    journal.append(result_entry("while True: pass", timed_out, [], None))
    entries = read_journal(journal.path)
    assert [type(e) for e in entries] == [JournalHeader, JournalCell, JournalCell, JournalCell]
    assert entries[0] == JournalHeader("s", 0.0, os.getpid(), 1) and journal.cells == 3

    nb = journal_to_notebook(entries, "s")
    nbformat.validate(nb)
    assert nb.metadata.kernelspec == KERNELSPEC
    assert [c.execution_count for c in nb.cells] == [1, 2, None]
    assert nb.cells[0].source == "print('hi')\n1+1"
    assert nb.cells[1].metadata.kernelbridge == {
        "source": "mcp", "servers": ["time"], "status": "error", "duration_ms": 12, "state": "kept",
    }  # fmt: skip
    assert nb.cells[2].metadata.kernelbridge["state"] == "lost"
    # It survives a write/read cycle through nbformat.
    again = nbformat.reads(nbformat.writes(nb), as_version=4)
    nbformat.validate(again)


def test_a_torn_last_line_and_lines_that_are_no_entries_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "x.journal.jsonl"
    junk = ["[1, 2]", '{"type": "mystery"}', '{"type": "cell", "code": ["not", "text"]}', "{{{"]
    path.write_text("\n".join([*junk, '{"type": "cell", "code": "1", "outputs": [7, {}]}', '{"type": "ce']))
    reader = JournalReader(path)
    (cell,) = list(reader)
    assert reader.skipped == len(junk) and reader.unknown == 1  # "mystery": a record of a newer bridge?
    # Fields of the wrong type are read as absent; the rest of the cell is kept.
    assert cell == JournalCell(code="1", outputs=[{}])


def test_a_journal_is_never_overwritten(tmp_path: Path) -> None:
    journal = started(tmp_path / "1.journal.jsonl")
    journal.append(result_entry("1", result(), [], None))
    with pytest.raises(FileExistsError):
        started(tmp_path / "1.journal.jsonl")
    assert len(read_journal(journal.path)) == 2


def test_export_session_writes_a_valid_notebook_of_a_live_journal(tmp_path: Path) -> None:
    """Another process's export of a live session: tests/process/test_session_generations.py."""
    settings = Settings(state_dir=tmp_path)
    store = SessionStore.of(settings)
    journal = started(store.journal_path(store.begin("other")), "other")
    journal.append(result_entry("x = 1", result(), [], None))
    nb = nbformat.read(str(export_session(settings, "other", tmp_path / "out.ipynb")), as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].source == "x = 1"


def test_export_of_an_unknown_session_says_so(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="no journal"):
        export_session(Settings(state_dir=tmp_path), "nope", tmp_path / "x.ipynb")
    with pytest.raises(SessionError, match="invalid session name"):
        export_session(Settings(state_dir=tmp_path), "../elsewhere", tmp_path / "x.ipynb")
