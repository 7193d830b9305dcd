"""The journal on disk and its notebook: valid nbformat, metadata, export from another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from kernelbridge.config import Settings
from kernelbridge.errors import SessionError
from kernelbridge.notebook.journal import (
    KERNELSPEC,
    Journal,
    export_session,
    journal_path,
    journal_to_notebook,
    read_journal,
)
from kernelbridge.session.cell import CellError, CellResult
from kernelbridge.session.registry import list_session_records


def result(**kw: object) -> CellResult:
    base: dict[str, object] = dict(
        status="ok", session="s", execution_count=1, stdout="hi\n", stderr="", result="2",
        error=None, truncated=False, duration_ms=12, state="kept",
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "hi\n"},
            {"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {},
             "execution_count": 1},
        ],
    )  # fmt: skip
    base.update(kw)
    return CellResult(**base)  # type: ignore[arg-type]


def test_journal_round_trips_into_a_valid_notebook(tmp_path: Path) -> None:
    journal = Journal(journal_path(tmp_path, "s"), "s")
    journal.start()
    journal.append("print('hi')\n1+1", result(), [])
    error = CellError("ZeroDivisionError", "division by zero", "ZeroDivisionError: division by zero")
    journal.append(
        "1/0",
        result(
            status="error", execution_count=2, error=error, result=None,
            outputs=[{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
                      "traceback": ["ZeroDivisionError: division by zero"]}],
        ),
        ["time"],
    )  # fmt: skip
    journal.append(
        "while True: pass", result(status="timeout", execution_count=None, state="lost", outputs=[]), []
    )
    entries = read_journal(journal.path)
    assert [e["type"] for e in entries] == ["session", "cell", "cell", "cell"]

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


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "x.journal.jsonl"
    path.write_text('{"type": "cell", "code": "1", "outputs": []}\n{"type": "ce')
    assert len(read_journal(path)) == 1


def test_restarting_a_session_keeps_the_previous_journal(tmp_path: Path) -> None:
    journal = Journal(journal_path(tmp_path, "s"), "s")
    journal.start()
    journal.append("1", result(), [])
    Journal(journal_path(tmp_path, "s"), "s").start()
    assert len(read_journal(journal.path)) == 1
    assert len(read_journal(journal.path.with_name(journal.path.name + ".prev"))) == 2


def test_export_session_works_from_another_process(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    journal = Journal(journal_path(settings.sessions_dir, "other"), "other")
    journal.start()
    journal.append("x = 1", result(), [])
    out = tmp_path / "out.ipynb"
    code = (
        "import sys; from pathlib import Path; from kernelbridge.config import Settings;"
        "from kernelbridge.notebook.journal import export_session;"
        "export_session(Settings(state_dir=Path(sys.argv[1])), 'other', sys.argv[2])"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path), str(out)], check=True, timeout=60)
    nb = nbformat.read(str(out), as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].source == "x = 1"
    assert export_session(settings, "other", tmp_path / "again.ipynb").exists()


def test_export_of_an_unknown_session_says_so(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="no journal"):
        export_session(Settings(state_dir=tmp_path), "nope", tmp_path / "x.ipynb")


def test_list_session_records_drops_dead_owners(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    for name, pid in [("live", os.getpid()), ("dead", int(dead.stdout))]:
        record = {"name": name, "connection_file": "/x", "container": "c", "kernel_id": "k",
                  "owner_pid": pid, "created": 0}  # fmt: skip
        (sessions / f"{name}.session.json").write_text(json.dumps(record))
    (sessions / "junk.session.json").write_text("{not json")
    assert [r["name"] for r in list_session_records(tmp_path)] == ["live"]
    assert list_session_records(tmp_path / "missing") == []
