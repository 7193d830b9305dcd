"""`kernelbridge replay`: a notebook re-run cell by cell in a fresh sandbox, each cell judged.

Real parts: the console script, a real sandbox container per replay, notebooks written by hand
with nbformat (what a person would commit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat import v4

pytestmark = pytest.mark.podman

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")


def replay(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KERNELBRIDGE), "replay", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")},
        check=False,
    )


def stdout(text: str) -> nbformat.NotebookNode:
    return v4.new_output("stream", name="stdout", text=text)


def write(tmp_path: Path, cells: list[nbformat.NotebookNode], name: str = "in.ipynb") -> Path:
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "kernelbridge", "display_name": "kernelbridge", "language": "python"}
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def verdicts(output: str) -> list[str]:
    return [line.split()[2] for line in output.splitlines() if line.startswith("cell ")]


def test_a_hand_written_notebook_replays_the_same(tmp_path: Path, sandbox_image: str) -> None:
    cells = [
        v4.new_markdown_cell("# by hand"),
        v4.new_code_cell("import os\nstate = 'carried over'"),
        v4.new_code_cell(
            "1 / 0",
            outputs=[
                v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])
            ],
        ),
        v4.new_code_cell("print(state, os.getuid())", outputs=[stdout("carried over 65534\n")]),
        v4.new_code_cell(
            "class Thing: pass\nThing()",
            execution_count=4,
            outputs=[
                v4.new_output(
                    "execute_result",
                    data={"text/plain": "<__main__.Thing at 0x7f0000000000>"},
                    execution_count=4,
                )
            ],
        ),
        v4.new_code_cell(
            "import time, datetime\nprint('at', datetime.datetime.now(), time.time_ns())",
            outputs=[stdout("at 2020-01-01 00:00:00.000001 1577836800000000001\n")],
        ),
    ]
    source, out = write(tmp_path, cells), tmp_path / "out.ipynb"
    result = replay(tmp_path, str(source), "-o", str(out), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdicts(result.stdout) == ["same"] * 5
    assert result.stdout.splitlines()[-2] == (
        "replayed 5 code cells in a fresh sandbox: 5 same, 0 different, 0 error, 0 skipped"
    )
    done = nbformat.read(out, as_version=4)
    nbformat.validate(done)
    assert done.cells[2].outputs[0]["ename"] == "ZeroDivisionError"
    assert done.cells[3].outputs[0]["text"] == "carried over 65534\n"
    assert done.cells[3].metadata["kernelbridge"]["replay"] == {"verdict": "same", "why": ""}
    # The scratch session of the replay leaves no record or journal behind.
    assert list((tmp_path / "state" / "sessions").iterdir()) == []


def test_a_cell_that_raises_now_fails_the_replay(tmp_path: Path, sandbox_image: str) -> None:
    cells = [
        v4.new_code_cell("data = {'a': 1}"),
        v4.new_code_cell("print(data['b'])", outputs=[stdout("2\n")]),
        v4.new_code_cell("print('still runs')", outputs=[stdout("still runs\n")]),
    ]
    result = replay(tmp_path, str(write(tmp_path, cells)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdicts(result.stdout) == ["same", "error", "same"]
    assert "cell   2  error      KeyError: 'b' (the original did not raise)" in result.stdout


def test_strict_fails_on_a_changed_output(tmp_path: Path, sandbox_image: str) -> None:
    cells = [v4.new_code_cell("print(6 * 7)", outputs=[stdout("41\n")])]
    path = write(tmp_path, cells)
    lenient = replay(tmp_path, str(path))
    strict = replay(tmp_path, str(path), "--strict")
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "cell   1  different  stdout differs: '41' -> '42'" in strict.stdout


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "is not a valid notebook: not JSON"),
        (json.dumps({"name": "a package.json, say"}), "is not a valid notebook: no 'cells' and 'nbformat'"),
        (
            json.dumps({"cells": "no", "nbformat": 4, "nbformat_minor": 5, "metadata": {}}),
            "is not a valid notebook",
        ),
        (None, "no such notebook"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "bogus.ipynb"
    if content is not None:
        path.write_text(content)
    result = replay(tmp_path, str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("kernelbridge: ") and why in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def old_notebook(cells: list[dict[str, object]], minor: int) -> str:
    """A notebook as older Jupyters wrote it: no cell ids, a kernelspec without ``name`` (nbclient
    runs these; nbformat's validation refuses the kernelspec)."""
    return json.dumps(
        {
            "cells": cells,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": minor,
        }
    )


def code(
    source: str, outputs: list[dict[str, object]] | None = None, count: int | None = None
) -> dict[str, object]:
    return {
        "cell_type": "code",
        "execution_count": count,
        "metadata": {},
        "outputs": outputs or [],
        "source": source,
    }


def test_replay_takes_what_nbclient_takes_and_judges_fairly(tmp_path: Path, sandbox_image: str) -> None:
    long_line = " ".join(f"word{n}" for n in range(60))
    cells = [
        code("import no_such_module_here\nframe = no_such_module_here.load()", count=1),
        code("rows = len(frame)", count=2),
        code("print(rows)", [{"output_type": "stream", "name": "stdout", "text": ["3\n"]}], count=3),
        code("print('never run before')"),  # no count, no outputs: never executed
        code(
            f"print({long_line!r} + ' now')",
            [{"output_type": "stream", "name": "stdout", "text": long_line + "\n"}],
            5,
        ),
        code("x = 1", [{"output_type": "mystery", "payload": 1}], count=6),
        code("print(typo)", count=7),
    ]
    for minor in (0, 2, 4):
        (tmp_path / f"old-{minor}.ipynb").write_text(old_notebook(cells, minor))
    out = tmp_path / "out.ipynb"
    result = replay(tmp_path, str(tmp_path / "old-2.ipynb"), "-o", str(out))
    assert result.returncode == 1, result.stdout + result.stderr  # cell 1 raises now
    # Nothing from third parties (nbformat's MissingIDFieldWarning, its "invalid" log line).
    assert result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "note: cell 6: output 1 has output_type 'mystery', which nbformat does not know: not judged"
    )
    assert verdicts(result.stdout) == ["error", "error", "error", "unexecuted", "different", "same", "error"]
    assert "cell   1  error      ModuleNotFoundError: No module named 'no_such_module_here'" in result.stdout
    assert "cell   2  error      follows from cell 1: NameError: name 'frame' is not defined" in result.stdout
    assert "cell   3  error      follows from cell 1: NameError: name 'rows' is not defined" in result.stdout
    assert "cell   4  unexecuted  not executed in the original; now it ran without an error" in result.stdout
    assert f"{long_line} now" in result.stdout  # the whole line, not cut mid-word
    assert "cell   7  error      NameError: name 'typo' is not defined" in result.stdout  # its own
    assert lines[-2].endswith(
        ": 1 same, 1 different, 2 error (and 2 that follow from them), 1 unexecuted, 0 skipped"
    )
    done = nbformat.read(out, as_version=4)
    nbformat.validate(done)  # ids given, the kernelspec named
    assert done.metadata.kernelspec["name"] == "kernelbridge" and all(cell.id for cell in done.cells)
    # The other minor versions are taken alike (bad input is status 2; these are not).
    for minor in (0, 4):
        again = replay(tmp_path, str(tmp_path / f"old-{minor}.ipynb"))
        assert again.returncode == 1 and again.stderr == "", again.stderr


def test_a_cell_never_run_before_that_raises_now_fails_the_replay(tmp_path: Path, sandbox_image: str) -> None:
    """Issue 23: a foreign notebook that was never executed (as an editor saves it) and fails
    replays as a failure, as `jupyter nbconvert --execute` fails on it; a cell tagged
    ``raises-exception`` may raise, as nbclient lets it."""
    fresh = v4.new_notebook(
        cells=[v4.new_code_cell("total = 1 + 1"), v4.new_code_cell("raise RuntimeError('boom')")]
    )
    path = tmp_path / "fresh.ipynb"
    nbformat.write(fresh, path)
    result = replay(tmp_path, str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdicts(result.stdout) == ["same", "error"], result.stdout
    assert (
        "cell   2  error      not executed in the original; now it raised RuntimeError: boom" in result.stdout
    )
    fresh.cells[1].metadata["tags"] = ["raises-exception"]
    nbformat.write(fresh, path)
    allowed = replay(tmp_path, str(path))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert verdicts(allowed.stdout) == ["same", "unexecuted"], allowed.stdout
