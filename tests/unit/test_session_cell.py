"""session/cell.py without a kernel: bounded text, scripted iopub messages, result assembly."""

from __future__ import annotations

import base64
import tracemalloc
from typing import Any

from kernelbridge.session.cell import (
    MAX_DISPLAYS,
    BoundedText,
    Cell,
    CellOutputs,
    compact_traceback,
    cut_middle,
    finish_cell,
    strip_ansi,
)
from kernelbridge.session.outcome import DisplaysDropped, State, Status

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def test_bounded_text_keeps_everything_under_the_limit() -> None:
    buf = BoundedText(100)
    for chunk in ["a\n", "\n", "()\n", ""]:
        buf.append(chunk)
    assert buf.render("stdout") == "a\n\n()\n"
    assert buf.cut == 0


def test_bounded_text_keeps_head_and_tail_and_says_how_much_was_cut() -> None:
    buf = BoundedText(100)
    buf.append("H" * 60)
    for _ in range(1000):
        buf.append("m" * 100)
    buf.append("T" * 50)
    text = buf.render("stdout")
    assert text.startswith("H" * 50)
    assert text.endswith("T" * 50)
    assert buf.total == 60 + 100_000 + 50
    assert buf.cut == buf.total - 100
    assert f"[{buf.cut:,} characters of stdout cut]" in text


def test_bounded_text_memory_stays_bounded_for_a_huge_stream() -> None:
    buf = BoundedText(20_000)
    chunk = "x" * 65_536
    tracemalloc.start()
    try:
        for _ in range(800):  # 50 MB through the buffer
            buf.append(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert buf.total == 800 * 65_536
    assert peak < 1_000_000, peak
    assert len(buf.render("stdout")) < 20_200


def test_bounded_text_last_lines() -> None:
    buf = BoundedText(1000)
    buf.append("".join(f"line {i}\n" for i in range(50)))
    assert buf.last_lines(2) == "line 48\nline 49"


def test_cut_middle() -> None:
    assert cut_middle("short", 10) == ("short", 0)
    text, cut = cut_middle("a" * 50 + "b" * 50, 20, "result")
    assert cut == 80 and text.startswith("a" * 10) and text.endswith("b" * 10) and "result" in text


def test_strip_ansi_and_compact_traceback() -> None:
    tb = [
        "\x1b[0;31m---------------------------------------------------------------------------\x1b[0m",
        "\x1b[0;31mZeroDivisionError\x1b[0m                         Traceback (most recent call last)",
        "Cell \x1b[0;32mIn[1], line 1\x1b[0m\n"
        "\x1b[0;32m----> 1\x1b[0m \x1b[38;5;241m1\x1b[39m\x1b[38;5;241m/\x1b[39m0",
        "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero",
    ]
    text = compact_traceback(tb)
    assert "\x1b" not in text
    assert "-----" not in text
    assert text.endswith("ZeroDivisionError: division by zero")
    assert "----> 1 1/0" in text
    assert strip_ansi("\x1b[1;31mred\x1b[0m") == "red"


def messages(outputs: CellOutputs, script: list[tuple[str, dict[str, Any]]]) -> CellOutputs:
    for msg_type, content in script:
        outputs.handle(msg_type, content)
    return outputs


def test_cell_outputs_from_scripted_messages_keep_order_for_the_notebook() -> None:
    out = messages(
        CellOutputs(1000),
        [
            ("execute_input", {"execution_count": 3, "code": "..."}),
            ("stream", {"name": "stdout", "text": "one\n"}),
            ("display_data", {"data": {"image/png": PNG, "text/plain": "<Image>"}, "metadata": {}}),
            ("stream", {"name": "stderr", "text": "warn\n"}),
            ("stream", {"name": "stdout", "text": "two\n"}),
            ("execute_result", {"execution_count": 3, "data": {"text/plain": "()"}, "metadata": {}}),
        ],
    )
    assert out.execution_count == 3
    assert out.images() == [PNG]
    assert out.result == "()"
    kinds = [(o["output_type"], o.get("name")) for o in out.notebook_outputs()]
    # As Jupyter keeps them: a stream is one output until another output comes between.
    assert kinds == [
        ("stream", "stdout"),
        ("display_data", None),
        ("stream", "stderr"),
        ("stream", "stdout"),
        ("execute_result", None),
    ]
    assert out.notebook_outputs()[0]["text"] == "one\n"
    assert out.stream_text("stdout") == "one\ntwo\n"


def test_cell_outputs_cap_rich_outputs_and_clear_output() -> None:
    out = CellOutputs(1000)
    for _ in range(MAX_DISPLAYS + 5):
        out.handle("display_data", {"data": {"text/plain": "x"}, "metadata": {}})
    assert out.displays == MAX_DISPLAYS and out.dropped_displays == 5 and out.truncated
    out.handle("clear_output", {"wait": False})
    assert out.displays == 0 and out.notebook_outputs() == [] and not out.truncated


def test_input_gets_a_plain_message() -> None:
    out = CellOutputs(1000)
    out.handle(
        "error", {"ename": "StdinNotImplementedError", "evalue": "raw_input was called", "traceback": []}
    )
    assert out.error is not None and "input() is not available" in out.error.traceback


def finished(script: list[tuple[str, dict[str, Any]]], reply: dict[str, Any]) -> Any:
    cell = Cell("m1", 1000)
    cell.on_iopub("status", {"execution_state": "busy"})
    for msg_type, content in script:
        cell.on_iopub(msg_type, content)
    cell.on_iopub("status", {"execution_state": "idle"})
    cell.on_reply(reply)
    assert cell.done
    return finish_cell(cell, session="s", status=Status.OK, state=State.KEPT)


def test_finish_cell_ok_and_error() -> None:
    ok = finished([("stream", {"name": "stdout", "text": "hi\n"})], {"status": "ok", "execution_count": 1})
    assert ok.status is Status.OK and ok.stdout == "hi\n" and ok.execution_count == 1 and ok.error is None
    err = finished(
        [("error", {"ename": "ValueError", "evalue": "bad", "traceback": ["ValueError: bad"]})],
        {"status": "error", "execution_count": 2, "ename": "ValueError", "evalue": "bad", "traceback": []},
    )
    assert err.status is Status.ERROR and err.error is not None and err.error.ename == "ValueError"
    assert err.error.as_dict() == {"ename": "ValueError", "evalue": "bad", "traceback": "ValueError: bad"}


def test_rich_outputs_past_the_bound_are_a_note_of_the_result() -> None:
    cell = Cell("m2", 1000)
    for _ in range(MAX_DISPLAYS + 3):
        cell.on_iopub("display_data", {"data": {"text/plain": "x"}, "metadata": {}})
    cell.on_iopub("status", {"execution_state": "idle"})
    result = finish_cell(cell, session="s", status=Status.OK, state=State.KEPT)
    assert result.notes == [DisplaysDropped(3, MAX_DISPLAYS)] and result.truncated


def test_a_cell_wakes_its_waiters_when_it_starts_ends_or_is_answered_not_per_output() -> None:
    cell = Cell("m1", 1000)
    waiting = cell.change_event
    cell.on_iopub("status", {"execution_state": "busy"})
    assert waiting.is_set() and cell.started is not None, "started: the runner's deadline moves"
    waiting = cell.change_event
    cell.on_iopub("execute_input", {"execution_count": 1, "code": "1+1"})
    cell.on_iopub("stream", {"name": "stdout", "text": "x\n"})
    cell.on_iopub("execute_result", {"execution_count": 1, "data": {"text/plain": "2"}, "metadata": {}})
    assert not waiting.is_set(), "outputs are read on the waiter's own clock"
    assert cell.outputs.result == "2" and cell.code == "1+1"
    cell.on_iopub("status", {"execution_state": "idle"})
    assert waiting.is_set() and not cell.done, "idle, the reply still to come"
    waiting = cell.change_event
    cell.on_reply({"status": "ok", "execution_count": 1})
    assert waiting.is_set() and cell.done
