"""Judging replayed cells: volatile values normalized away, real differences caught, verdicts."""

from __future__ import annotations

import base64
import zlib

import pytest

from kernelbridge.replay import CellVerdict, ReplayReport, behaviour, judge, normalize_text
from kernelbridge.replay.judge import FailedNames, bound_names, ran_in_original, unexecuted


def stream(text: str, name: str = "stdout") -> dict[str, object]:
    return {"output_type": "stream", "name": name, "text": text}


def result(data: dict[str, object]) -> dict[str, object]:
    return {"output_type": "execute_result", "data": data, "metadata": {}, "execution_count": 1}


def error(ename: str, evalue: str) -> dict[str, object]:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": ["Cell In[3], line 1"]}


def png(width: int, height: int, fill: int = 0) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    rows = b"".join(b"\0" + bytes([fill]) * width for _ in range(height))
    raw = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("<Foo object at 0x7f3b077d6d90>", "<Foo object at 0x7f11aa22bb30>"),
        ("took 1.25 s", "took 0.98 s"),
        ("35 ms", "1200 ms"),
        ("1.2 µs ± 3 ns per loop (mean ± std. dev. of 7 runs, 100,000 loops each)",
         "5.6 µs ± 40 ns per loop (mean ± std. dev. of 7 runs, 10,000 loops each)"),
        ("id 140233845771440", "id 139912233445566"),
        ("now 2026-11-30T04:25:06.123456+00:00", "now 2027-01-02T23:59:59Z"),
        ("on 2026-11-30 at 04:25:06", "on 2025-01-01 at 13:00:00"),
        ("wrote /tmp/tmpab12cd/x.csv", "wrote /tmp/tmpzz99yy/x.csv"),
        ("msg 3f2b9c0e-1d2a-4b3c-8d4e-5f6a7b8c9d0e", "msg 00000000-1111-2222-3333-444444444444"),
        ("\x1b[31mred\x1b[0m", "red"),
    ],
)  # fmt: skip
def test_volatile_values_are_normalized_away(a: str, b: str) -> None:
    assert normalize_text(a) == normalize_text(b)


@pytest.mark.parametrize(
    ("a", "b"), [("x = 1", "x = 2"), ("3.14", "3.15"), ("[1, 2]", "[2, 1]"), ("ok", "OK")]
)
def test_real_values_are_not_normalized(a: str, b: str) -> None:
    assert normalize_text(a) != normalize_text(b)


def test_same_outputs_are_same_whatever_the_counts_and_tracebacks() -> None:
    was = behaviour([stream("a\n"), stream("b\n"), result({"text/plain": "<Obj at 0x7fffaaaa0000>"})])
    now = behaviour([stream("a\nb\n"), result({"text/plain": "<Obj at 0x7fffbbbb1111>"})], "ok")
    assert judge(1, was, now) == CellVerdict(1, "same")
    raised = behaviour([error("ZeroDivisionError", "division by zero")], "error")
    again = behaviour([{**error("ZeroDivisionError", "division by zero"), "traceback": ["other"]}], "error")
    assert judge(2, raised, again).verdict == "same"


def test_a_new_exception_is_an_error_and_a_lost_one_is_a_difference() -> None:
    ok = behaviour([stream("fine\n")], "ok")
    raised = behaviour([error("KeyError", "'x'")], "error")
    verdict = judge(3, ok, raised)
    assert verdict.verdict == "error" and verdict.why == "KeyError: 'x' (the original did not raise)"
    assert judge(3, raised, ok).verdict == "different"
    assert judge(3, raised, behaviour([error("ValueError", "bad")], "error")).verdict == "different"


def test_timeouts_are_judged_as_timeouts() -> None:
    interrupted = behaviour([stream("partial\n"), error("KeyboardInterrupt", "")], "timeout")
    restarted = behaviour([stream("partial\n")], "timeout")
    assert judge(1, interrupted, restarted).verdict == "same"
    assert judge(1, behaviour([stream("partial\n")], "ok"), restarted).verdict == "error"


def test_output_differences_name_what_differs() -> None:
    was = behaviour([stream("total 10\n")])
    verdict = judge(4, was, behaviour([stream("total 11\n")]))
    assert verdict.verdict == "different" and "stdout differs" in verdict.why and "'total 11'" in verdict.why
    assert judge(4, was, behaviour([stream("total 10\n"), stream("warn\n", "stderr")])).verdict == "different"
    two = behaviour([result({"text/plain": "1"}), result({"text/plain": "2"})])
    assert "2 rich outputs" in judge(4, behaviour([result({"text/plain": "1"})]), two).why
    html = behaviour([result({"text/plain": "x", "text/html": "<b>x</b>"})])
    assert "types" in judge(4, behaviour([result({"text/plain": "x"})]), html).why


def test_images_are_compared_by_size_not_bytes() -> None:
    a = behaviour([{"output_type": "display_data", "data": {"image/png": png(4, 3, 0)}, "metadata": {}}])
    b = behaviour([{"output_type": "display_data", "data": {"image/png": png(4, 3, 255)}, "metadata": {}}])
    c = behaviour([{"output_type": "display_data", "data": {"image/png": png(5, 3, 0)}, "metadata": {}}])
    assert a.displays == [{"image/png": "<png 4x3>"}]
    assert judge(1, a, b).verdict == "same"
    assert judge(1, a, c).verdict == "different"


def test_report_lines_summary_and_exit_rule() -> None:
    report = ReplayReport([CellVerdict(1, "same"), CellVerdict(2, "different", "stdout differs"),
                           CellVerdict(3, "skipped", "empty cell")])  # fmt: skip
    assert (
        report.summary()
        == "replayed 3 code cells in a fresh sandbox: 1 same, 1 different, 0 error, 1 skipped"
    )
    assert report.text().splitlines()[1] == "cell   2  different  stdout differs"
    assert not report.failed() and report.failed(strict=True)
    report.cells.append(CellVerdict(4, "error", "KeyError: 'x' (the original did not raise)"))
    assert report.failed()


# -- issue 17: unexecuted cells, errors that follow from an earlier one, whole explanations --------
def test_a_cell_never_run_is_unexecuted_saying_what_it_did_now() -> None:
    assert not ran_in_original([], None, {}) and ran_in_original([], 3, {})
    assert ran_in_original([], None, {"source": "client"})
    verdict = unexecuted(2, behaviour([stream("hi\n")], "ok"))
    assert verdict == CellVerdict(
        2, "unexecuted", "not executed in the original; now it ran without an error"
    )
    # One that raises now is a failed replay (issue 23), as `nbconvert --execute` fails on it,
    # unless the cell is tagged to raise.
    raised = unexecuted(3, behaviour([error("NameError", "name 'x' is not defined")], "error"))
    assert raised.verdict == "error"
    assert raised.why == "not executed in the original; now it raised NameError: name 'x' is not defined"
    assert ReplayReport([raised]).failed()
    allowed = unexecuted(3, behaviour([error("RuntimeError", "boom")], "error"), may_raise=True)
    assert allowed.verdict == "unexecuted" and not ReplayReport([allowed]).failed()


def test_errors_that_follow_from_a_failed_cell_say_so_and_count_with_it() -> None:
    failed = FailedNames()
    root = judge(3, behaviour([]), behaviour([error("ModuleNotFoundError", "No module named 'pandas'")]))
    failed.failed(root, "import pandas as pd\n%matplotlib inline\nframe, other = pd.DataFrame(), 1")
    missing = behaviour([error("NameError", "name 'frame' is not defined")])
    follower = failed.cause(judge(4, behaviour([]), missing), missing)
    assert follower.follows == 3 and follower.line().startswith("cell   4  error      follows from cell 3: ")
    failed.failed(follower, "df = frame.copy()")
    again = behaviour([error("NameError", "name 'df' is not defined")])
    assert failed.cause(judge(5, behaviour([]), again), again).follows == 3  # through cell 4
    unrelated = behaviour([error("NameError", "name 'typo' is not defined")])
    assert failed.cause(judge(6, behaviour([]), unrelated), unrelated).follows is None
    report = ReplayReport([root, follower, CellVerdict(5, "error", "x", follows=3), CellVerdict(6, "same")])
    assert report.summary().endswith("1 same, 0 different, 1 error (and 2 that follow from it), 0 skipped")
    assert report.failed() and report.as_dict()["counts"]["follows"] == 2


def test_names_a_cell_binds_are_its_top_level_ones() -> None:
    source = (
        "import os.path, numpy as np\nfrom x import (y as z)\nfor i, (j, k) in []: pass\n"
        "with open('f') as handle: pass\ndef f():\n    hidden = 1\nclass C: pass\n[q for q in ()]\n!ls"
    )
    assert bound_names(source) == {"os", "np", "z", "i", "j", "k", "handle", "f", "C"}
    assert bound_names("def broken(:") == set()


def test_explanations_are_whole_and_a_long_value_is_cut_at_a_word_saying_so() -> None:
    words = " ".join(f"word{n}" for n in range(200))
    verdict = judge(1, behaviour([stream(words + "\n")]), behaviour([stream(words + " more\n")]))
    assert "[... " in verdict.why and "more characters]" in verdict.why
    quoted = verdict.why.split("'")[1]
    assert quoted.split(" [...")[0].split()[-1].startswith("word")  # ends on a whole word
    assert all(w.startswith("word") and w[4:].isdigit() for w in quoted.split(" [...")[0].split())
    was = behaviour([stream("a fairly long line of output that the old report cut\n")])
    short = judge(
        1, was, behaviour([stream("a fairly long line of output that the new report keeps whole\n")])
    )
    assert short.why.endswith("-> 'a fairly long line of output that the new report keeps whole'")


def test_a_summary_names_unexecuted_cells_only_when_there_are_some() -> None:
    report = ReplayReport([CellVerdict(1, "same"), CellVerdict(2, "unexecuted", "not executed")])
    assert report.summary().endswith("1 same, 0 different, 0 error, 1 unexecuted, 0 skipped")
    assert not report.failed(strict=True)
    assert (
        ReplayReport([CellVerdict(1, "same")]).summary().endswith("1 same, 0 different, 0 error, 0 skipped")
    )
