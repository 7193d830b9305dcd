"""Tracebacks for the model (kernelbridge.tracebacks) on real IPython tracebacks: library frames
before the raising one left out with one note line, the user's frames and the raising frame kept."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from kernelbridge.session.cell import strip_ansi
from kernelbridge.session.tracebacks import trim_traceback


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def traceback_of(shell: InteractiveShell, code: str) -> list[str]:
    """The structured traceback ipykernel would send for ``code``, without colours."""
    shell.showtraceback = lambda *a, **k: None  # type: ignore[method-assign]
    result = shell.run_cell(code, store_history=True)
    assert result.error_in_exec is not None
    etype, value, tb = type(result.error_in_exec), result.error_in_exec, result.error_in_exec.__traceback__
    return [strip_ansi(part) for part in shell.InteractiveTB.structured_traceback(etype, value, tb)]


def test_library_frames_before_the_raising_one_are_left_out(shell: InteractiveShell) -> None:
    parts = traceback_of(shell, "import json\ndef parse(x):\n    return json.loads(x)\nparse('nope')")
    trimmed = trim_traceback(parts)
    text = "\n".join(trimmed.parts)
    full = "\n".join(parts)
    # json.loads and JSONDecoder.decode left out; raw_decode raised and stays, shortened.
    assert trimmed.left_out == 2
    assert "parse('nope')" in text and "return json.loads(x)" in text  # the user's two frames
    assert "raise JSONDecodeError" in text and "in JSONDecoder.raw_decode(" in text
    assert "in loads(s, cls, object_hook" in full and "in loads(" not in text
    assert text.rstrip().endswith("JSONDecodeError: Expecting value: line 1 column 1 (char 0)")
    (note,) = [line for line in text.splitlines() if "left out" in line]
    assert note == (
        "[... 2 library frames (the standard library) left out; the full traceback is in the session's"
        " notebook ...]"
    )
    assert len(text) < len(full)


def test_the_users_own_module_is_not_a_library(shell: InteractiveShell, tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text("import json\n\ndef load(x):\n    return json.loads(x)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        parts = traceback_of(shell, "import mymod\nmymod.load('{')")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mymod", None)
    text = "\n".join(trim_traceback(parts).parts)
    assert "mymod.py:4, in load(x)" in text and "return json.loads(x)" in text


def test_each_exception_of_a_chain_keeps_its_raising_frame(shell: InteractiveShell) -> None:
    code = (
        "import json\n"
        "try:\n    json.loads('nope')\n"
        "except ValueError as exc:\n    raise RuntimeError('bad config') from exc\n"
    )
    parts = traceback_of(shell, code)
    trimmed = trim_traceback(parts)
    text = "\n".join(trimmed.parts)
    assert "The above exception was the direct cause" in text
    assert "raise JSONDecodeError" in text and "RuntimeError: bad config" in text
    assert trimmed.left_out == 2
    assert sum("left out" in line for line in text.splitlines()) == 1


def test_nothing_to_leave_out_is_left_as_it_is(shell: InteractiveShell) -> None:
    for code in ("1/0", "def f():\n    return g()\ndef g():\n    raise KeyError('k')\nf()", "x = (\n"):
        try:
            parts = traceback_of(shell, code)
        except AssertionError:  # a SyntaxError is not an exec error; use its own formatting
            parts = [
                strip_ansi(p)
                for p in shell.SyntaxTB.structured_traceback(SyntaxError, SyntaxError("x"), None)
            ]
        trimmed = trim_traceback(parts)
        assert trimmed.left_out == 0 and trimmed.parts == parts


def test_unknown_parts_are_kept() -> None:
    parts = ["something", "File /usr/lib/python3.11/x.py:1, in f()\n  1 raise X", "weird"]
    assert trim_traceback(parts).parts == parts
