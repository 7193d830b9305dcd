"""The journal's byte budget, bounded reading, and notebooks written one cell at a time (issue 13)."""

from __future__ import annotations

import io
import json
import os
import tracemalloc
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest

from kernelbridge.notebook.export import (
    MAX_SPLIT_LINES,
    NotebookTooLarge,
    notebook_text,
    restorable_notebook,
    write_notebook,
)
from kernelbridge.notebook.journal import (
    Journal,
    JournalCell,
    JournalHeader,
    JournalReader,
    JournalTruncated,
)
from kernelbridge.session.cell import CellResult
from kernelbridge.session.outcome import JournalFull, State, Status
from kernelbridge.session.recording import result_entry
from kernelbridge.testing.notebooks import journal_to_notebook, read_journal

PNG = "iVBORw0KGgo" + "A" * 1000


def result(text: str, n: int = 1) -> CellResult:
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": text},
        {"output_type": "display_data", "data": {"image/png": PNG, "text/plain": "<Figure>\nline 2"},
         "metadata": {}},
        {"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {}, "execution_count": n},
    ]  # fmt: skip
    return CellResult(status=Status.OK, session="s", execution_count=n, stdout=text, stderr="",
                      result="2", error=None, truncated=False, duration_ms=5, state=State.KEPT,
                      outputs=outputs)  # fmt: skip


def started(path: Path, budget: int = 64 * 1024 * 1024) -> Journal:
    journal = Journal(path, budget=budget)
    journal.start(JournalHeader("s", 0.0, os.getpid(), 1))
    return journal


def append(
    journal: Journal, code: str, done: CellResult, servers: list[str] | None = None, **kw: float
) -> None:
    journal.append(result_entry(code, done, servers or [], kw.get("timeout")))


def test_past_the_budget_one_truncated_line_and_nothing_more(tmp_path: Path) -> None:
    budget = 64 * 1024
    journal = started(tmp_path / "1.journal.jsonl", budget=budget)
    for n in range(100):
        append(journal, f"print({n})", result("x" * 10_000, n))
    assert journal.truncated and 0 < journal.cells < 10
    size = journal.path.stat().st_size
    assert size == journal.written and size <= budget + 200
    kinds = [type(e) for e in read_journal(journal.path)]
    assert kinds == [JournalHeader] + [JournalCell] * journal.cells + [JournalTruncated]
    append(journal, "print('later')", result("small"))
    assert journal.path.stat().st_size == size  # nothing more, however small
    nb = journal_to_notebook(read_journal(journal.path), "s")
    nbformat.validate(nb)
    assert nb.cells[-1].cell_type == "markdown" and "KERNELBRIDGE_JOURNAL_BUDGET" in nb.cells[-1].source


def test_reading_stops_at_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.journal.jsonl"
    cell = {
        "type": "cell",
        "code": "1",
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "y" * 999}],
    }
    path.write_text("".join(json.dumps(cell) + "\n" for _ in range(1000)))  # an older bridge's, over 1 MB
    entries = list(JournalReader(path, 100_000))
    assert entries[-1] == JournalTruncated(read_limit=100_000)
    assert 90 <= len(entries) - 1 <= 100
    nb = journal_to_notebook(entries, "big")
    assert "continues past 100,000 bytes" in nb.cells[-1].source


def test_the_streamed_notebook_is_what_nbformat_writes(tmp_path: Path) -> None:
    journal = started(tmp_path / "1.journal.jsonl")
    append(journal, "import math\nx = 1\n\nprint(x)", result("a\nb\r\nc\n"), ["time"], timeout=5)
    append(journal, "", result(""))
    out = io.StringIO()
    assert write_notebook(JournalReader(journal.path), "s", out) == 2
    text = out.getvalue()
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert nbformat.writes(nb) + "\n" == text + "\n"  # byte for byte what nbformat would write
    assert (
        nb.cells[0].source == "import math\nx = 1\n\nprint(x)"
        and nb.cells[0].metadata.kernelbridge["timeout"] == 5
    )
    empty = io.StringIO()
    write_notebook([], "none", empty)
    assert nbformat.writes(nbformat.reads(empty.getvalue(), as_version=4)) == empty.getvalue()


def test_a_cell_of_millions_of_lines_is_written_in_bounded_memory(tmp_path: Path) -> None:
    lines = "\n" * (4 * MAX_SPLIT_LINES)
    display = {
        "output_type": "display_data",
        "data": {"text/plain": lines, "text/html": lines},
        "metadata": {},
    }
    entry = JournalCell(code=lines, outputs=[display])
    tracemalloc.start()
    out = io.StringIO()
    write_notebook([entry], "s", out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 30 * len(lines) + (1 << 20), peak  # copies of the text, not an object per line
    nb = nbformat.reads(out.getvalue(), as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].source == lines


def test_a_notebook_too_big_to_return_whole_says_what_to_do(tmp_path: Path) -> None:
    journal = started(tmp_path / "1.journal.jsonl")
    for n in range(20):
        append(journal, f"print({n})", result("z" * 10_000, n))
    with pytest.raises(NotebookTooLarge, match=r"too big to return whole: export_notebook\(session, path="):
        notebook_text(journal.path, "s", max_bytes=10**9, max_chars=100_000)
    assert len(notebook_text(journal.path, "s", max_bytes=10**9)) > 200_000


def test_a_restore_gets_the_cells_without_their_images_bytes(tmp_path: Path) -> None:
    from kernelbridge.replay import behaviour

    journal = started(tmp_path / "1.journal.jsonl")
    big = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAADCAYAAAC56t6BAAAA" + "A" * 3_000_000
    data = {"image/png": big, "image/jpeg": "/9j/" * 1000, "text/plain": "<Figure>"}
    outputs = [{"output_type": "display_data", "data": data, "metadata": {}}]
    done = result("x")
    done.outputs = outputs
    append(journal, "plot()", done)
    nb = restorable_notebook(journal.path, "s", max_bytes=10**9)
    (cell,) = nb.cells
    assert len(json.dumps(cell)) < 2000 and cell.source == "plot()"
    assert behaviour(cell.outputs).displays == [{"image/jpeg": "<image/jpeg>", "image/png": "<png 2x3>",
                                                 "text/plain": "<Figure>"}]  # fmt: skip


def test_disk_use_counts_a_namespaces_files_and_follows_no_link(tmp_path: Path) -> None:
    from kernelbridge.config import Settings
    from kernelbridge.session.store import disk_use

    state, exports, elsewhere = tmp_path / "state", tmp_path / "exports", tmp_path / "elsewhere"
    for directory in (state / "sessions", exports / "a", elsewhere):
        directory.mkdir(parents=True)
    (state / "sessions" / "s.journal.jsonl").write_bytes(b"x" * 1000)
    (exports / "a" / "n.ipynb").write_bytes(b"y" * 500)
    (elsewhere / "big").write_bytes(b"z" * 10_000)
    (state / "link").symlink_to(elsewhere)
    used = disk_use(Settings(state_dir=state, export_dir=exports))
    assert 1500 <= used <= 1500 + 2 * 16384 and used < 10_000  # the two files' blocks, not the link's


def test_disk_use_fails_closed_past_its_file_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbridge.config import Settings
    from kernelbridge.session import store

    monkeypatch.setattr(store, "MAX_COUNTED_FILES", 10)
    for n in range(11):
        (tmp_path / f"s{n}.journal.jsonl").write_text("{}")
    assert store.disk_use(Settings(state_dir=tmp_path)) == store.FULL


@pytest.mark.anyio
async def test_a_tokens_disk_quota_bounds_its_journals_and_exports(tmp_path: Path) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    from kernelbridge.config import Settings
    from kernelbridge.server.exports import check_quota
    from kernelbridge.session import SessionRegistry
    from kernelbridge.testing import LocalProcessRuntime

    settings = Settings(state_dir=tmp_path, warm_pool=0, disk_quota=3 << 20)
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "old.ipynb").write_bytes(b"x" * (2 << 20))  # 2 of its 3 MiB are taken
    big = "from IPython.display import display\ndisplay({'image/png': 'A' * 400_000}, raw=True)"
    async with (
        LocalProcessRuntime() as runtime,
        SessionRegistry(settings, runtime, image="test-double", agent_hash=None) as registry,
    ):
        notes = [(await registry.run("s", big, timeout=30)).notes for _ in range(3)]
        journal = registry.journal_file("s")
    with pytest.raises(ToolError, match=r"quota \(KERNELBRIDGE_HTTP_DISK_QUOTA"):
        await check_quota(settings, "s")  # 2 MiB + the journal, and as much again for its notebook
    await check_quota(replace(settings, disk_quota=10 << 20), "s")
    assert journal.stat().st_size < (1 << 20) + 256
    told = [n for result_notes in notes for n in result_notes if isinstance(n, JournalFull)]
    assert told == [JournalFull(told[0].budget, "KERNELBRIDGE_HTTP_DISK_QUOTA", 3 << 20)], notes
    assert told[0].budget <= 1 << 20  # what was left of the quota
