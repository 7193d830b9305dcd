"""Where outcomes become prose: a call's result as an MCP tool result, and every note as a sentence.

The session layer and the server's own modules hand over values (a
:class:`~kernelbridge.session.cell.CellResult` with its :mod:`~kernelbridge.session.outcome`
notes, the server's :mod:`~kernelbridge.server.notes`, a restore's
:class:`~kernelbridge.replay.ReplayReport`); this module is the one place that words them
for a model: short text first (outputs verbatim, the notes, one status line), images as image
content, and the full record as ``structuredContent``, whose ``notes`` are these sentences and
whose ``note_codes`` say the same as machine-readable codes (one per note, in order).

The wording is public: the model reads it. tests/unit/test_server_render.py pins every sentence.
"""

from __future__ import annotations

from typing import Any, assert_never

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent

from kernelbridge.notebook.export import MAX_INLINE_CHARS, NotebookFacts
from kernelbridge.replay.judge import ReplayReport
from kernelbridge.server.notes import (
    FilesPlaced,
    ImageDownscaled,
    ImageNotDownscaled,
    ImagesNotSent,
    LimitsNotEnforced,
    Restored,
    ServerNote,
)
from kernelbridge.session.cell import CellResult
from kernelbridge.session.outcome import (
    Adopted,
    BackgroundOutput,
    ClosedWhileRunning,
    DisplaysDropped,
    FreshSandbox,
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
    Status,
    Stop,
    TimedOut,
    Unresponsive,
    Waited,
)
from kernelbridge.session.recording import QUOTA_SETTING
from kernelbridge.session.runner import TIMEOUT_GRACE

MAX_IMAGES = 10
"""Images returned per call; more would flood the model's context."""
_LOST = (
    "variables and its files in /workspace are lost; the next call on this session starts a fresh sandbox."
)
_FILES_KEPT = " Files in /workspace are kept (same sandbox)."


def render_note(note: Note) -> str:
    """The sentence(s) a model reads for ``note``."""
    if isinstance(note, SessionNote):
        return _session_note(note)
    if isinstance(note, ServerNote):
        return _server_note(note)
    raise TypeError(f"no wording for {type(note).__name__}")


def _session_note(note: SessionNote) -> str:
    match note:
        case FreshSandbox(died=died, cells=cells, restore=restore):
            why = f"The previous sandbox died ({died})" if died else "The previous sandbox was discarded"
            offer = (
                f" Its {cells} earlier cell(s) are in the journal: close_session, then"
                f" run_python(restore={restore!r}) re-runs them in a fresh sandbox."
                if restore
                else ""
            )
            return (
                f"{why}; this call started a fresh one: earlier variables, imports and files in "
                f"/workspace are gone.{offer}"
            )
        case SandboxDied(reason=reason):
            return f"The sandbox died: {reason}. Its {_LOST}"
        case NotSent(reason=reason):
            return f"The cell could not be sent: {reason}. The sandbox was discarded: its {_LOST}"
        case ClosedWhileRunning():
            return "The session was closed while this cell ran."
        case TimedOut(timeout=timeout, stop=stop):
            if stop is Stop.INTERRUPTED:
                return f"Timed out after {timeout:g} s and was interrupted; the session's variables are kept."
            files = (
                _FILES_KEPT
                if stop is Stop.RESTARTED
                else " The sandbox did not restart in time and was discarded: files in /workspace are gone"
                " too."
            )
            return (
                f"Timed out after {timeout:g} s and ignored the interrupt, so the kernel was restarted: "
                f"all variables and imports are lost.{files}"
            )
        case Unresponsive(timeout=timeout, stop=stop):
            if stop is Stop.INTERRUPTED:
                return (
                    f"The kernel did not begin this cell within {timeout:g} s; it was interrupted and "
                    "the session's variables are kept."
                )
            files = (
                _FILES_KEPT
                if stop is Stop.RESTARTED
                else " It was discarded: files in /workspace are gone too; the next call starts a fresh"
                " sandbox."
            )
            return (
                f"The sandbox did not respond: the kernel did not begin this cell within {timeout:g} s, so "
                f"it was replaced; all variables and imports are lost.{files}"
            )
        case NeverStarted(waited=waited):
            return (
                f"The kernel was busy with another client's cell for {waited:g} s; this cell never started "
                "(it will run when the kernel is free)."
            )
        case Queued(ahead=ahead, started_ago=started_ago, seconds=seconds):
            return (
                f"This call queued behind {ahead}, started {started_ago:.0f} s ago;"
                f" it waited {seconds:.1f} s."
            )
        case Waited(seconds=seconds):
            return f"This cell waited {seconds:.1f} s behind another client's cell."
        case ProxiesNotRefreshed():
            return (
                "The host MCP proxies (mcp_<server>) could not be refreshed in the kernel; "
                "`await runtime.call_tool(server, tool, arguments)` still works."
            )
        case BackgroundOutput(text=text, displays=displays):
            extra = f" and {displays} display(s)" if displays else ""
            shown = f":\n{text}" if text else "."
            return f"Output that arrived between calls (e.g. from a background thread){extra}{shown}"
        case DisplaysDropped(count=count, limit=limit):
            return f"{count} further rich outputs were not kept (limit {limit})."
        case JournalFull(budget=budget, setting=setting, quota=quota):
            if quota is not None:
                mib = quota / 2**20
                why = f"This client's files on the host reached their quota of {mib:.0f} MiB ({QUOTA_SETTING}"
            else:
                why = f"The session's journal reached its budget of {budget / 2**20:g} MiB ({setting}"
            return (
                f"{why}, set by the bridge's operator): this cell and later ones are not recorded, so the "
                "session's notebook (export_notebook) ends before them. The session itself goes on."
            )
        case JournalFailed(reason=reason):
            return (
                f"The session's journal could not be written ({reason}): its notebook "
                "(export_notebook) misses cells from here on."
            )
        case Adopted():
            return _adopted(note)
        case SandboxLost(reason=reason, cells=cells, restore=restore, ran=ran, rebuilt=rebuilt):
            head = f"This session's sandbox, which outlived its bridge, could not be taken over: {reason}."
            if rebuilt:
                return head + (
                    f" Its {cells} cell(s) were re-run from its journal ({restore}) in a fresh sandbox"
                    " first (KERNELBRIDGE_AUTO_RESTORE), host tool calls answered from the recording;"
                    " this call's code ran after them."
                )
            lost = " Its variables, imports and files in /workspace are lost."
            offer = (
                f" Its {cells} cell(s) are in its journal: run_python(restore={restore!r}) re-runs them "
                "in a fresh sandbox."
                if restore
                else ""
            )
            ran_text = (
                " This call's code ran in a fresh sandbox."
                if ran
                else " This call's code did not run; call again to start a fresh sandbox."
            )
            return head + lost + offer + ran_text
        case _:
            assert_never(note)


_HOW_LEFT = {
    "detach": "its bridge exited",
    "eof": "its bridge went away without a word: killed, or its client went",
    "broken": "its bridge went away without a word: killed, or its client went",
    "silent": "its bridge stopped answering",
}


def _adopted(note: Adopted) -> str:
    """The first result of a session whose sandbox this bridge took over."""
    how = f"; {_HOW_LEFT[note.how]}" if note.how in _HOW_LEFT else ""
    parts = [
        f"This session was adopted: its sandbox outlived its bridge ({note.detached:.0f} s with no bridge"
        f"{how}); variables, imports and files in /workspace are kept (state: kept)."
    ]
    for cell in note.cells:
        count = f"[{cell.execution_count}] " if cell.execution_count is not None else ""
        if cell.status == "running":
            status = (
                "is still running (its result will not be reported; its output below is what came so far)"
            )
        else:
            status = f"finished while no bridge was attached ({cell.status})"
        heard = "" if cell.heard else "; none of its output reached this bridge"
        shown = f":\n{cell.output}" if cell.output else ""
        parts.append(f"A cell the previous bridge sent, {count}{cell.code!r}, {status}{heard}{shown}")
    if note.dropped:
        parts.append(
            f"{note.dropped} message(s) of output ({note.dropped_bytes:,} bytes) were dropped while no "
            "bridge was attached (the sandbox's buffer was full)."
        )
    if note.torn_journal:
        parts.append("The journal's last line was cut off when the previous bridge died; it is skipped.")
    return "\n".join(parts)


def _server_note(note: ServerNote) -> str:
    match note:
        case Restored(session=session, report=report):
            return restore_text(session, report)
        case FilesPlaced(files=files):
            return (
                "Placed in /workspace: " + ", ".join(f"{path} ({size:,} bytes)" for path, size in files) + "."
            )
        case LimitsNotEnforced():
            return (
                "Note: this host's container runtime does not enforce memory or process limits; the operator"
                " allowed that (KERNELBRIDGE_ALLOW_UNLIMITED), so keep memory use and process counts modest."
            )
        case ImagesNotSent(count=count, limit=limit):
            return f"{count} more image(s) were not sent (limit {limit})."
        case ImageNotDownscaled(number=n, kib=kib, budget=budget, uri=uri):
            return (
                f"Image {n} ({kib:,} KB) is over the {budget:,}-character image budget and could not be "
                f"downscaled; the original is the resource {uri}."
            )
        case ImageDownscaled(number=n, kib=kib, original=(w, h), size=(sw, sh), uri=uri):
            return (
                f"Image {n} was {w}x{h} ({kib:,} KB): sent downscaled to {sw}x{sh} to fit the image budget; "
                f"the full-size original is the resource {uri}."
            )
        case _:
            assert_never(note)


def restore_text(session: str, report: ReplayReport) -> str:
    """What a restore says: the replay's report, then what the session now holds."""
    budget = (
        f"\nThe restore took {report.seconds:.1f} s of its {report.budget:g} s budget (run_python's "
        f"timeout; a cell that overran gets up to {TIMEOUT_GRACE:g} s more to be interrupted)."
        if report.budget is not None
        else ""
    )
    return f"{report.text()}\nSession {session!r} now holds the state the notebook built.{budget}"


def render_text(result: CellResult) -> str:
    """The text a model reads: outputs verbatim, then the notes, then one status line."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    if result.stderr:
        err = result.stderr if result.stderr.endswith("\n") else result.stderr + "\n"
        parts.append("[stderr]\n" + err)
    if result.error is not None:
        parts.append(result.error.traceback + "\n")
    if result.result is not None:
        parts.append(f"Out[{result.execution_count}]: {result.result}\n")
    parts.extend(render_note(note) + "\n" for note in result.notes)
    where = f"[{result.execution_count}]" if result.execution_count is not None else ""
    line = f"-- {result.status}{' ' + where if where else ''} in session {result.session!r}, "
    line += f"{result.duration_ms} ms, state {result.state}"
    if result.truncated:
        line += ", output truncated"
    return "".join(parts) + line


def structured(result: CellResult) -> dict[str, Any]:
    """``structuredContent`` of a ``run_python`` result (the public contract)."""
    return {
        "status": result.status.value,
        "session": result.session,
        "execution_count": result.execution_count,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "result": result.result,
        "error": result.error.as_dict() if result.error else None,
        "truncated": result.truncated,
        "duration_ms": result.duration_ms,
        "state": result.state.value,
        "notes": [render_note(note) for note in result.notes],
        "note_codes": [note.code for note in result.notes],
        "tool_calls": [call.summary() for call in result.tool_calls],
        "packages": [record.summary() for record in result.packages],
    }


def to_tool_result(result: CellResult, media: list[ContentBlock] | None = None) -> CallToolResult:
    """``media``: the images as they should be sent (``server/images.py`` fits them to the
    budget); by default the cell's images as they are."""
    content: list[ContentBlock] = [TextContent(type="text", text=render_text(result))]
    if media is not None:
        content.extend(media)
    for png in result.images[:MAX_IMAGES] if media is None else []:
        content.append(ImageContent(type="image", data=png, mime_type="image/png"))
    return CallToolResult(
        content=content, structured_content=structured(result), is_error=result.status is not Status.OK
    )


def restore_result(session: str, report: ReplayReport, notes: list[Note]) -> CallToolResult:
    """The result of a ``run_python`` call that only restored (and maybe placed files)."""
    text = "\n".join([restore_text(session, report), *map(render_note, notes)])
    status = Status.ERROR if report.failed() else Status.OK
    structured = {"status": status.value, "session": session, "restore": report.as_dict()}
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured, is_error=report.failed()
    )


def notes_result(notes: list[Note]) -> CallToolResult:
    """The result of a ``run_python`` call that only placed files."""
    return CallToolResult(content=[TextContent(type="text", text="\n".join(map(render_note, notes)))])


def export_result(session: str, facts: NotebookFacts, resource: str, file: str | None) -> CallToolResult:
    """What ``export_notebook`` answers: what the notebook holds and where it is, never the notebook
    (``file``: where it was written, as the model may be told; None: nothing was written)."""
    what = f"{facts.cells} cell{'s' * (facts.cells != 1)}, {_size(facts.bytes)}"
    if facts.inline:
        served = f"MCP clients read it whole as the resource {resource}"
    else:
        limit = MAX_INLINE_CHARS / 2**20
        served = f"It is too big for the resource {resource} (over {limit:g} MiB of JSON)"
    if file is not None:
        text = f"Wrote the notebook of session {session!r} to {file}: {what}. {served}."
    else:
        suggested = session.replace("@", "-") + ".ipynb"
        text = (
            f"The notebook of session {session!r}: {what}; not shown here, to keep your context small."
            f" {served}; export_notebook(session={session!r}, path={suggested!r}) writes it to a file."
        )
    structured = {
        "session": session,
        "cells": facts.cells,
        "bytes": facts.bytes,
        "resource": resource,
        "resource_too_big": not facts.inline,
        "file": file,
    }
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def _size(count: int) -> str:
    if count < 1024:
        return f"{count:,} bytes"
    if count < 2**20:
        return f"{count / 1024:.1f} KiB"
    return f"{count / 2**20:.1f} MiB"
