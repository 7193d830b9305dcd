"""Jupyter's output rules, with scripted iopub messages (as nbclient's ``prepare_cell_mocks``): what
a cell keeps, what an update of an earlier cell's display does to the journal and its notebook, and
bad input (an update for an id never shown, a hand-edited journal) costing one line.

The messages are those ipykernel sends for the cells of nbclient's ``tests/files/Clear Output.ipynb``
and ``update-display-id.ipynb``; the expected outputs are what nbclient saves for them (the
integration test ``tests/integration/test_output_fidelity.py`` checks the same against nbclient
running a local kernel).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelbridge.notebook.export import export_to_path, find_png
from kernelbridge.notebook.journal import Journal, JournalDisplay, JournalHeader
from kernelbridge.session.outputs import MAX_OUTPUTS, CellOutputs
from kernelbridge.session.recorder import Recorder
from kernelbridge.session.recording import SessionJournal
from kernelbridge.session.text import StreamText
from kernelbridge.testing.notebooks import journal_to_notebook, read_journal
from kernelbridge.tunnel import ClientExecute

pytestmark = pytest.mark.anyio

Script = list[tuple[str, dict[str, Any]]]


def out(name: str, text: str) -> tuple[str, dict[str, Any]]:
    return "stream", {"name": name, "text": text}


def show(text: str, display_id: str | None = None, kind: str = "display_data") -> tuple[str, dict[str, Any]]:
    content: dict[str, Any] = {"data": {"text/plain": repr(text)}, "metadata": {}}
    content["transient"] = {"display_id": display_id} if display_id else {}
    if kind == "execute_result":
        content["execution_count"] = 1
    return kind, content


def clear(wait: bool = False) -> tuple[str, dict[str, Any]]:
    return "clear_output", {"wait": wait}


def outputs(script: Script) -> list[dict[str, Any]]:
    cell = CellOutputs(10_000)
    for msg_type, content in script:
        cell.handle(msg_type, content)
    return cell.notebook_outputs()


def texts(outs: list[dict[str, Any]]) -> list[str]:
    return [o["text"] if o["output_type"] == "stream" else o["data"]["text/plain"] for o in outs]


@pytest.mark.parametrize(
    ("script", "kept"),
    [
        # for i in range(10): clear_output(); print(i)
        ([m for i in range(10) for m in (clear(), out("stdout", f"{i}\n"))], ["9\n"]),
        # print("Hello world"); clear_output()
        ([out("stdout", "Hello world\n"), clear()], []),
        # print("Hello world", end=""); clear_output(wait=True): nothing follows, so it stays
        ([out("stdout", "Hello world"), clear(wait=True)], ["Hello world"]),
        # print("Hello", end=""); clear_output(wait=True); print("world", end="")
        ([out("stdout", "Hello"), clear(wait=True), out("stdout", "world")], ["world"]),
        # display("Hello world", display_id="id3"); clear_output(wait=True)
        ([show("Hello world", "id3"), clear(wait=True)], ["'Hello world'"]),
        # an error clears a waiting clear too; a display update does not
        ([out("stdout", "a"), clear(wait=True), show("x", "d", "update_display_data")], ["a"]),
    ],
)
def test_clear_output_waits_for_the_next_output(script: Script, kept: list[str]) -> None:
    assert texts(outputs(script)) == kept


def test_streams_coalesce_while_consecutive_and_keep_a_progress_bars_last_state() -> None:
    kept = outputs(
        [
            out("stdout", "a"),
            out("stdout", "b\n"),
            out("stderr", "warn\n"),
            out("stdout", "\r 10%"),
            out("stdout", "\r 50%"),
            out("stdout", "\r100%\n"),
            show("fig"),
            out("stdout", "after\r\n"),  # a carriage return before a newline stays, as nbclient keeps it
        ]
    )
    assert [(o["output_type"], o.get("name")) for o in kept] == [
        ("stream", "stdout"),
        ("stream", "stderr"),
        ("stream", "stdout"),
        ("display_data", None),
        ("stream", "stdout"),
    ]
    assert texts(kept) == ["ab\n", "warn\n", "100%\n", "'fig'", "after\r\n"]


def test_stream_text_overwrites_line_by_line_as_the_whole_text_would() -> None:
    chunks = ["x\r", "y", "\rzz\nkeep\r", "\n", "\r\r1", "2\r3\n", "tail\rT"]
    stream = StreamText(10_000)
    for chunk in chunks:
        stream.append(chunk)
    whole = "".join(chunks)
    import re

    assert stream.render("stdout") == re.sub(r".*\r(?=[^\n])", "", whole)  # nbconvert's CR_PAT


def test_a_progress_line_without_newline_stays_bounded() -> None:
    stream = StreamText(1000)
    for n in range(100_000):
        stream.append(f"\r{n:>8} done")
    assert stream.render("stdout") == f"{99_999:>8} done" and len(stream.line) <= 1000 + 20


def test_display_ids_update_earlier_outputs_and_transient_is_never_stored() -> None:
    kept = outputs(
        [
            show("above"),
            show("1", "here"),
            show("below"),
            show("2", "here"),  # a new output, and the earlier one shows 2 as well
            show("3", "here", "update_display_data"),  # no output of its own
            show("never shown", "nowhere", "update_display_data"),
        ]
    )
    assert texts(kept) == ["'above'", "'3'", "'below'", "'3'"]
    assert all("transient" not in o for o in kept)
    for o in kept:
        nbformat.validate(
            nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[nbformat.from_dict(o)])])
        )


def test_a_clear_forgets_the_cells_display_ids() -> None:
    cell = CellOutputs(1000)
    cell.handle(*show("Hello", "id4"))
    cell.handle(*clear(wait=True))
    cell.handle(*out("stdout", "world"))
    event = cell.handle(*show("Hello world", "id4", "update_display_data"))
    assert event is not None and not cell.update_display(event)  # it is cleared: nothing shows it
    assert texts(cell.notebook_outputs()) == ["world"]


def test_execute_result_keeps_its_count_and_is_the_result() -> None:
    cell = CellOutputs(1000)
    cell.handle("execute_input", {"execution_count": 4, "code": "x"})
    cell.handle(*show("7", kind="execute_result"))
    (result,) = cell.notebook_outputs()
    assert result["output_type"] == "execute_result" and result["execution_count"] == 1
    assert cell.result == "'7'"


def test_alternating_streams_are_bounded_in_outputs() -> None:
    cell = CellOutputs(1000)
    for n in range(5 * MAX_OUTPUTS):
        cell.handle(*out("stdout" if n % 2 else "stderr", f"{n}\n"))
    assert len(cell.items) <= MAX_OUTPUTS + 2 and cell.merged_streams > 0
    assert f"{5 * MAX_OUTPUTS - 1}\n" in cell.stream_text("stdout")


# -- across cells, through the recorder and the journal -----------------------------------------
def iopub(parent: str, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    return {
        "header": {"msg_id": f"{parent}-{msg_type}-{id(content)}", "msg_type": msg_type},
        "parent_header": {"msg_id": parent, "msg_type": "execute_request"},
        "content": content,
    }


class Session:
    """A recorder and a session journal wired as the registry wires them, cells sent by a client."""

    def __init__(self, path: Path) -> None:
        journal = Journal(path)
        journal.start(JournalHeader("s", 0.0, os.getpid(), 1))
        self.journal = SessionJournal(journal, "s", quota=None, later=[])
        self.sent: dict[str, ClientExecute] = {}
        self.recorder = Recorder(
            10_000,
            on_client_cell=lambda cell: self.journal.append_client(cell, []),
            client_execute=lambda msg_id: self.sent.pop(msg_id, None),
            on_display=self.journal.on_display,
        )
        self.count = 0

    async def run(self, code: str, script: Script) -> None:
        self.count += 1
        parent = f"cell{self.count}"
        self.sent[parent] = ClientExecute("person", "s1", code)
        messages = [
            ("status", {"execution_state": "busy"}),
            ("execute_input", {"code": code, "execution_count": self.count}),
            *script,
            ("status", {"execution_state": "idle"}),
        ]
        for msg_type, content in messages:
            await self.recorder.on_iopub(iopub(parent, msg_type, content))


async def test_an_update_in_a_later_cell_changes_the_earlier_cell_in_the_export(tmp_path: Path) -> None:
    session = Session(tmp_path / "1.journal.jsonl")
    await session.run('h = display("Hello", display_id="id1")', [show("Hello", "id1")])
    await session.run('h.update("world")', [show("world", "id1", "update_display_data")])
    await session.run('h.update("!"); h.update("world!")', [
        show("!", "id1", "update_display_data"), show("world!", "id1", "update_display_data")
    ])  # fmt: skip
    await session.run("print(1)", [out("stdout", "1\n")])
    entries = read_journal(session.journal._journal.path)  # type: ignore[union-attr]
    # The journal is append-only: the first cell's line still says "Hello"; one update record per
    # cell that changed it (the last update of each), written before the next cell's line.
    assert [e.data["text/plain"] for e in entries if isinstance(e, JournalDisplay)] == ["'world'", "'world!'"]
    nb = journal_to_notebook(entries, "s")
    assert [texts(cell.outputs) for cell in nb.cells] == [["'world!'"], [], [], ["1\n"]]
    nbformat.validate(nb)
    exported = tmp_path / "out.ipynb"
    export_to_path(session.journal._journal.path, "s", exported, max_bytes=10**8)  # type: ignore[union-attr]
    assert texts(nbformat.read(exported, as_version=4).cells[0].outputs) == ["'world!'"]


async def test_a_new_display_with_the_same_id_updates_earlier_cells_even_when_cleared(tmp_path: Path) -> None:
    session = Session(tmp_path / "1.journal.jsonl")
    await session.run("a", [show("v1", "d")])
    await session.run("b", [show("v2", "d"), clear()])  # shown, then cleared from its own cell
    nb = journal_to_notebook(read_journal(tmp_path / "1.journal.jsonl"), "s")
    assert [texts(cell.outputs) for cell in nb.cells] == [["'v2'"], []]


async def test_an_update_for_an_id_never_shown_is_one_line_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    session = Session(tmp_path / "1.journal.jsonl")
    await session.run("a", [show("v1", "d")])
    with caplog.at_level(logging.INFO):
        for _ in range(50):
            await session.run("b", [show("x", "ghost", "update_display_data")])
    assert len([r for r in caplog.records if "no cell shows" in r.message]) == 1
    entries = read_journal(tmp_path / "1.journal.jsonl")
    assert not any(isinstance(e, JournalDisplay) for e in entries)
    assert texts(journal_to_notebook(entries, "s").cells[0].outputs) == ["'v1'"]


def test_a_hand_edited_journal_exports_with_one_line_per_kind_of_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "1.journal.jsonl"
    journal = Journal(path)
    journal.start(JournalHeader("s", 0.0, os.getpid(), 1))
    lines = [
        '{"type": "cell", "code": "a", "outputs": [{"output_type": "display_data",'
        ' "data": {"text/plain": "1"}, "metadata": {}}], "display_ids": {"d": [0], "bad": ["x"], "": [0]}}',
        '{"type": "display", "display_id": "ghost", "data": {"text/plain": "boo"}}',
        '{"type": "display", "display_id": "ghost", "data": {"text/plain": "boo"}}',
        '{"type": "display", "display_id": "d", "data": {"text/plain": "2"}, "metadata": null}',
        '{"type": "display", "display_id": "d", "data": "not an object"}',
        '{"type": "package", "name": "from a newer bridge"}',
        '{"type": "cell", "code": "b", "outputs": [{"output_type": "mystery", "x": 1}]}',
        '{"type": "cell", "code": "c", "outp',
    ]
    with open(path, "a") as f:
        f.write("\n".join(lines))
    exported = tmp_path / "out.ipynb"
    with caplog.at_level(logging.WARNING):
        export_to_path(path, "s", exported, max_bytes=10**8)
    nb = nbformat.read(exported, as_version=4)
    nbformat.validate(nb)
    assert texts(nb.cells[0].outputs) == ["2"]  # the valid update applies
    assert nb.cells[1].outputs[0]["output_type"] == "stream"  # the unknown output: a note in its place
    said = [r.message for r in caplog.records]
    assert sum("no earlier cell shows" in m for m in said) == 1
    assert sum("not entries" in m for m in said) == 1 and sum("does not read" in m for m in said) == 1


def test_an_updated_image_of_an_earlier_cell_can_be_found(tmp_path: Path) -> None:
    from kernelbridge.notebook.export import digest

    path = tmp_path / "1.journal.jsonl"
    journal = Journal(path)
    journal.start(JournalHeader("s", 0.0, os.getpid(), 1))
    journal.append_record(JournalDisplay("d", {"image/png": "iVBORw0KGgo="}, {}))
    assert find_png(path, digest("iVBORw0KGgo=") + ".png", 10**6) == b"\x89PNG\r\n\x1a\n"
