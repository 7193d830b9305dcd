"""The one place outcomes become prose: every note's sentence, word for word (the model reads
them, so the wording is pinned here and nowhere else), and a result's text and structuredContent."""

from __future__ import annotations

import typing

import pytest

from kernelbridge.errors import ExitKind
from kernelbridge.replay import CellVerdict, ReplayReport
from kernelbridge.server.notes import (
    FilesPlaced,
    ImageDownscaled,
    ImageNotDownscaled,
    ImagesNotSent,
    LimitsNotEnforced,
    Restored,
    ServerNote,
)
from kernelbridge.server.render import render_note, render_text, structured, to_tool_result
from kernelbridge.session.broker import ToolCallRecord
from kernelbridge.session.cell import CellError, CellResult
from kernelbridge.session.outcome import (
    Adopted,
    BackgroundOutput,
    ClosedWhileRunning,
    DisplaysDropped,
    FreshSandbox,
    InheritedOutcome,
    JournalFailed,
    JournalFull,
    NeverStarted,
    Note,
    NotSent,
    ProxiesNotRefreshed,
    Queued,
    SandboxDied,
    SandboxLost,
    SessionNote,
    State,
    Status,
    Stop,
    TimedOut,
    Unresponsive,
    Waited,
)

MiB = 2**20
SENTENCES: list[tuple[Note, str]] = [
    (
        FreshSandbox("out of memory"),
        "The previous sandbox died (out of memory); this call started a fresh one: earlier variables, "
        "imports and files in /workspace are gone.",
    ),
    (
        FreshSandbox("its node died", 3, "kernelbridge://sessions/s@1/notebook"),
        "The previous sandbox died (its node died); this call started a fresh one: earlier variables, "
        "imports and files in /workspace are gone. Its 3 earlier cell(s) are in the journal: "
        "close_session, then run_python(restore='kernelbridge://sessions/s@1/notebook') re-runs them in "
        "a fresh sandbox.",
    ),
    (
        FreshSandbox(None),
        "The previous sandbox was discarded; this call started a fresh one: earlier variables, imports "
        "and files in /workspace are gone.",
    ),
    (
        SandboxDied("the kernel was killed (SIGKILL)", ExitKind.KERNEL_DIED),
        "The sandbox died: the kernel was killed (SIGKILL). Its variables and its files in /workspace are"
        " lost; the next call on this session starts a fresh sandbox.",
    ),
    (
        NotSent("its stdin is not drained"),
        "The cell could not be sent: its stdin is not drained. The sandbox was discarded: its variables "
        "and its files in /workspace are lost; the next call on this session starts a fresh sandbox.",
    ),
    (
        ClosedWhileRunning(),
        "The session was closed while this cell ran.",
    ),
    (
        TimedOut(8, Stop.INTERRUPTED),
        "Timed out after 8 s and was interrupted; the session's variables are kept.",
    ),
    (
        TimedOut(8, Stop.RESTARTED),
        "Timed out after 8 s and ignored the interrupt, so the kernel was restarted: all variables and "
        "imports are lost. Files in /workspace are kept (same sandbox).",
    ),
    (
        TimedOut(2.5, Stop.DISCARDED),
        "Timed out after 2.5 s and ignored the interrupt, so the kernel was restarted: all variables and "
        "imports are lost. The sandbox did not restart in time and was discarded: files in /workspace are"
        " gone too.",
    ),
    (
        Unresponsive(8, Stop.INTERRUPTED),
        "The kernel did not begin this cell within 8 s; it was interrupted and the session's variables "
        "are kept.",
    ),
    (
        Unresponsive(8, Stop.RESTARTED),
        "The sandbox did not respond: the kernel did not begin this cell within 8 s, so it was replaced; "
        "all variables and imports are lost. Files in /workspace are kept (same sandbox).",
    ),
    (
        Unresponsive(8, Stop.DISCARDED),
        "The sandbox did not respond: the kernel did not begin this cell within 8 s, so it was replaced; "
        "all variables and imports are lost. It was discarded: files in /workspace are gone too; the next"
        " call starts a fresh sandbox.",
    ),
    (
        NeverStarted(600),
        "The kernel was busy with another client's cell for 600 s; this cell never started (it will run "
        "when the kernel is free).",
    ),
    (
        Waited(2.345),
        "This cell waited 2.3 s behind another client's cell.",
    ),
    (
        Queued("task abc", 812.4, 3.25),
        "This call queued behind task abc, started 812 s ago; it waited 3.2 s.",
    ),
    (
        ProxiesNotRefreshed(),
        "The host MCP proxies (mcp_<server>) could not be refreshed in the kernel; `await "
        "runtime.call_tool(server, tool, arguments)` still works.",
    ),
    (
        BackgroundOutput("late 1\nlate 2", 2),
        "Output that arrived between calls (e.g. from a background thread) and 2 display(s):\nlate 1\nlate 2",
    ),
    (
        BackgroundOutput("", 0),
        "Output that arrived between calls (e.g. from a background thread).",
    ),
    (
        DisplaysDropped(7, 50),
        "7 further rich outputs were not kept (limit 50).",
    ),
    (
        JournalFull(8 * MiB, "KERNELBRIDGE_JOURNAL_BUDGET"),
        "The session's journal reached its budget of 8 MiB (KERNELBRIDGE_JOURNAL_BUDGET, set by the "
        "bridge's operator): this cell and later ones are not recorded, so the session's notebook "
        "(export_notebook) ends before them. The session itself goes on.",
    ),
    (
        JournalFull(MiB // 2, "KERNELBRIDGE_HTTP_DISK_QUOTA", 3 * MiB),
        "This client's files on the host reached their quota of 3 MiB (KERNELBRIDGE_HTTP_DISK_QUOTA, set "
        "by the bridge's operator): this cell and later ones are not recorded, so the session's notebook "
        "(export_notebook) ends before them. The session itself goes on.",
    ),
    (
        Adopted(12.4, "detach"),
        "This session was adopted: its sandbox outlived its bridge (12 s with no bridge; its bridge "
        "exited); variables, imports and files in /workspace are kept (state: kept).",
    ),
    (
        Adopted(
            3,
            "eof",
            (
                InheritedOutcome(4, "print('done')", "ok", "done", True),
                InheritedOutcome(5, "while True: pass", "running", "", False),
            ),
            dropped=3,
            dropped_bytes=4096,
            torn_journal=True,
        ),
        "This session was adopted: its sandbox outlived its bridge (3 s with no bridge; its bridge went "
        "away without a word: killed, or its client went); variables, imports and files in /workspace "
        "are kept (state: kept).\n"
        "A cell the previous bridge sent, [4] \"print('done')\", finished while no bridge was attached "
        "(ok):\ndone\n"
        "A cell the previous bridge sent, [5] 'while True: pass', is still running (its result will not "
        "be reported; its output below is what came so far); none of its output reached this bridge\n"
        "3 message(s) of output (4,096 bytes) were dropped while no bridge was attached (the sandbox's "
        "buffer was full).\n"
        "The journal's last line was cut off when the previous bridge died; it is skipped.",
    ),
    (
        SandboxLost(
            "its container is gone", 2, 3, "kernelbridge://sessions/s/notebook?generation=2", ran=False
        ),
        "This session's sandbox, which outlived its bridge, could not be taken over: its container is "
        "gone. Its variables, imports and files in /workspace are lost. Its 3 cell(s) are in its "
        "journal: run_python(restore='kernelbridge://sessions/s/notebook?generation=2') re-runs them in "
        "a fresh sandbox. This call's code did not run; call again to start a fresh sandbox.",
    ),
    (
        SandboxLost("it ended itself", 1, 0, None),
        "This session's sandbox, which outlived its bridge, could not be taken over: it ended itself. "
        "Its variables, imports and files in /workspace are lost. This call's code ran in a fresh sandbox.",
    ),
    (
        JournalFailed("No space left on device"),
        "The session's journal could not be written (No space left on device): its notebook "
        "(export_notebook) misses cells from here on.",
    ),
    (
        FilesPlaced((("in/a.txt", 16), ("b.bin", 1024))),
        "Placed in /workspace: in/a.txt (16 bytes), b.bin (1,024 bytes).",
    ),
    (
        LimitsNotEnforced(),
        "Note: this host's container runtime does not enforce memory or process limits; the operator "
        "allowed that (KERNELBRIDGE_ALLOW_UNLIMITED), so keep memory use and process counts modest.",
    ),
    (
        ImagesNotSent(3, 10),
        "3 more image(s) were not sent (limit 10).",
    ),
    (
        ImageNotDownscaled(2, 1500, 50_000, "kernelbridge://sessions/s/outputs/ab.png"),
        "Image 2 (1,500 KB) is over the 50,000-character image budget and could not be downscaled; the "
        "original is the resource kernelbridge://sessions/s/outputs/ab.png.",
    ),
    (
        ImageDownscaled(1, 80, (400, 300), (200, 150), "kernelbridge://sessions/s/outputs/ab.png"),
        "Image 1 was 400x300 (80 KB): sent downscaled to 200x150 to fit the image budget; the full-size "
        "original is the resource kernelbridge://sessions/s/outputs/ab.png.",
    ),
]


@pytest.mark.parametrize(("note", "sentence"), SENTENCES, ids=lambda value: getattr(value, "code", ""))
def test_each_note_reads_so(note: Note, sentence: str) -> None:
    assert render_note(note) == sentence


def test_every_kind_of_note_has_its_wording_and_a_code() -> None:
    kinds = {*typing.get_args(SessionNote), *typing.get_args(ServerNote)}
    pinned = {type(note) for note, _ in SENTENCES} | {Restored}
    assert kinds == pinned
    codes = [kind.code for kind in kinds]
    assert len(set(codes)) == len(codes) and all(code.islower() and " " not in code for code in codes)


def test_a_restore_says_its_report_and_its_budget() -> None:
    report = ReplayReport([CellVerdict(1, "same"), CellVerdict(2, "skipped", "empty cell")], "session 'copy'")
    report.budget, report.seconds = 30.0, 1.25
    assert render_note(Restored("copy", report)) == (
        "cell   1  same\ncell   2  skipped    empty cell\n"
        "replayed 2 code cells in session 'copy': 1 same, 0 different, 0 error, 1 skipped\n"
        "Session 'copy' now holds the state the notebook built.\n"
        "The restore took 1.2 s of its 30 s budget (run_python's timeout; a cell that overran gets up "
        "to 12 s more to be interrupted)."
    )


def result(**changes: object) -> CellResult:
    base: dict[str, object] = dict(
        status=Status.TIMEOUT, session="s", execution_count=3, stdout="partial", stderr="warn", result=None,
        error=None, truncated=True, duration_ms=8012, state=State.KEPT,
        notes=[TimedOut(8, Stop.INTERRUPTED)],
        tool_calls=[ToolCallRecord("edge", "echo", True, 4, None, {"text": "a"}, {"ok": 1})],
    )  # fmt: skip
    base.update(changes)
    return CellResult(**base)  # type: ignore[arg-type]


def test_a_result_reads_outputs_then_notes_then_one_status_line() -> None:
    assert render_text(result()) == (
        "partial\n[stderr]\nwarn\n"
        "Timed out after 8 s and was interrupted; the session's variables are kept.\n"
        "-- timeout [3] in session 's', 8012 ms, state kept, output truncated"
    )
    error = CellError("KeyError", "'x'", "KeyError: 'x'")
    ok = result(
        status=Status.ERROR, stdout="", stderr="", error=error, truncated=False, notes=[], result=None
    )
    assert render_text(ok) == "KeyError: 'x'\n-- error [3] in session 's', 8012 ms, state kept"


def test_structured_content_keeps_the_contract_and_adds_the_codes() -> None:
    done = result(notes=[TimedOut(8, Stop.INTERRUPTED), DisplaysDropped(2, 50)])
    content = structured(done)
    assert content == {
        "status": "timeout", "session": "s", "execution_count": 3, "stdout": "partial", "stderr": "warn",
        "result": None, "error": None, "truncated": True, "duration_ms": 8012, "state": "kept",
        "notes": [render_note(note) for note in done.notes], "note_codes": ["timed_out", "displays_dropped"],
        "tool_calls": [{"server": "edge", "tool": "echo", "ok": True, "duration_ms": 4, "error": None}],
        "packages": [],
    }  # fmt: skip
    assert to_tool_result(done).is_error and not to_tool_result(result(status=Status.OK)).is_error


def test_an_export_says_what_the_notebook_holds_and_where_it_is_never_the_notebook() -> None:
    from kernelbridge.notebook.export import MAX_INLINE_CHARS, NotebookFacts
    from kernelbridge.server.render import export_result

    resource = "kernelbridge://sessions/alpha/notebook"
    summary = export_result("alpha", NotebookFacts(12, 1_021_415, 1_021_415), resource, None)
    assert summary.content[0].text == (  # type: ignore[union-attr]
        "The notebook of session 'alpha': 12 cells, 997.5 KiB; not shown here, to keep your context small."
        " MCP clients read it whole as the resource kernelbridge://sessions/alpha/notebook;"
        " export_notebook(session='alpha', path='alpha.ipynb') writes it to a file."
    )
    assert summary.structured_content == {
        "session": "alpha",
        "cells": 12,
        "bytes": 1_021_415,
        "resource": resource,
        "resource_too_big": False,
        "file": None,
    }
    assert not summary.is_error
    big = NotebookFacts(1, MAX_INLINE_CHARS + 1, MAX_INLINE_CHARS + 1)
    written = export_result("g@2", big, "kernelbridge://sessions/g@2/notebook", "/state/exports/g.ipynb")
    assert written.content[0].text == (  # type: ignore[union-attr]
        "Wrote the notebook of session 'g@2' to /state/exports/g.ipynb: 1 cell, 16.0 MiB. It is too big"
        " for the resource kernelbridge://sessions/g@2/notebook (over 16 MiB of JSON)."
    )
    assert written.structured_content is not None
    assert written.structured_content["file"] == "/state/exports/g.ipynb"
    assert written.structured_content["resource_too_big"] is True
    tiny = export_result("s", NotebookFacts(0, 120, 120), "kernelbridge://sessions/s/notebook", None)
    assert "0 cells, 120 bytes" in tiny.content[0].text  # type: ignore[union-attr]
