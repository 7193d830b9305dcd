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


def test_a_compiled_frame_is_a_library_frame_without_its_missing_source(shell: InteractiveShell) -> None:
    # pyzmq's Socket is Cython (pure Python mode): IPython names its frame by a relative path whose
    # source it "could not get".
    code = "import zmq\ndef open_socket():\n    return zmq.Context().socket(999)\nopen_socket()"
    parts = traceback_of(shell, code)
    full = "\n".join(parts)
    assert "File zmq/backend/cython/_zmq.py" in full and "Could not get source" in full
    trimmed = trim_traceback(parts)
    text = "\n".join(trimmed.parts)
    assert "return zmq.Context().socket(999)" in text  # the user's frame
    assert "File zmq/backend/cython/_zmq.py" in text  # where it was raised, kept
    assert "Could not get source" not in text
    assert "[... 2 library frames (zmq) left out;" in text
    assert text.rstrip().endswith("ZMQError: Invalid argument")


# ipykernel 7.4 / IPython 9.18 in the sandbox image, as the journal recorded it (colours removed):
# pandas' C parser raises four Cython frames below read_csv.
SANDBOX_PARSER_ERROR = [
    "---------------------------------------------------------------------------",
    "ParserError                               Traceback (most recent call last)",
    "Cell In[1], line 2\n      1 import pandas as pd, io\n"
    "----> 2 pd.read_csv(io.StringIO('a,b\\n1,2\\n3,4,5,6\\n'))\n",
    "File /usr/local/lib/python3.11/dist-packages/pandas/io/parsers/readers.py:1866, in"
    " read_csv(filepath_or_buffer, sep, delimiter, header, names, index_col, usecols, dtype, engine)\n"
    "-> 1866 return _read(filepath_or_buffer, kwds)\n",
    "File /usr/local/lib/python3.11/dist-packages/pandas/io/parsers/c_parser_wrapper.py:297, in"
    " CParserWrapper.read(self, nrows)\n--> 297         chunks = self._reader.read_low_memory(nrows)\n",
    *(
        f"File pandas/_libs/parsers.pyx:{line}, in pandas._libs.parsers.TextReader.{name}()\n"
        f"-> {line} 'Could not get source, probably due dynamically evaluated source code.'\n"
        for line, name in ((1041, "read_low_memory"), (1182, "_read_rows"), (1149, "_tokenize_rows"))
    ),
    "File pandas/_libs/parsers.pyx:4400, in pandas._libs.parsers.raise_parser_error()\n"
    "-> 4400 'Could not get source, probably due dynamically evaluated source code.'\n",
    "ParserError: Error tokenizing data. C error: Expected 2 fields in line 3, saw 4\n",
]


def test_cython_frames_of_the_sandbox_are_left_out_and_counted() -> None:
    trimmed = trim_traceback(SANDBOX_PARSER_ERROR)
    assert trimmed.left_out == 5
    assert trimmed.parts == [
        *SANDBOX_PARSER_ERROR[:3],
        "[... 5 library frames (pandas) left out; the full traceback is in the session's notebook ...]",
        "File pandas/_libs/parsers.pyx:4400, in pandas._libs.parsers.raise_parser_error()\n",
        SANDBOX_PARSER_ERROR[-1],
    ]


def test_kernelbridge_own_frames_are_left_out_even_where_they_raised(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    # A module at the sandbox package's place (…/kernelbridge/inside/pythonpath/): a hidden proxy
    # frame calling a check that raises, as a tool proxy calls its signature's argument check.
    package = tmp_path / "kernelbridge" / "inside" / "pythonpath"
    package.mkdir(parents=True)
    (package / "fake_proxy.py").write_text(
        "def check(kwargs):\n"
        "    raise TypeError(f'get_time() got an unexpected keyword argument {next(iter(kwargs))!r}')\n"
        "\n"
        "def get_time(**kwargs):\n"
        "    __tracebackhide__ = True\n"
        "    return check(kwargs)\n"
    )
    sys.path.insert(0, str(package))
    try:
        parts = traceback_of(shell, "import fake_proxy\nfake_proxy.get_time(tz='UTC')")
    finally:
        sys.path.remove(str(package))
        sys.modules.pop("fake_proxy", None)
    full = "\n".join(parts)
    assert "skipping hidden 1 frame" in full and "fake_proxy.py:2, in check(kwargs)" in full
    trimmed = trim_traceback(parts)
    assert trimmed.left_out == 0
    assert trimmed.parts == [
        parts[0],
        parts[1],
        next(p for p in parts if p.startswith("Cell In[")),
        "TypeError: get_time() got an unexpected keyword argument 'tz'",
    ]
