"""`kernelbridge replay`: a notebook re-run cell by cell in a fresh sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

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


def test_replay_runs_every_cell_in_a_sandbox(tmp_path: Path, sandbox_image: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# a journal"),
        nbformat.v4.new_code_cell("import os\nstate = 'carried over'"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print(state, os.getuid())"),
    ]
    source, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, source)
    result = replay(tmp_path, str(source), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"replayed 3 code cells in a fresh sandbox: 1 raised (0 had raised in the original); wrote {out}"
    )
    done = nbformat.read(out, as_version=4)
    nbformat.validate(done)
    assert done.cells[2].outputs[0]["ename"] == "ZeroDivisionError"
    assert done.cells[3].outputs[0]["text"] == "carried over 65534\n"


def test_replay_of_a_file_that_is_not_a_notebook_is_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.ipynb"
    bogus.write_text("{not json")
    result = replay(tmp_path, str(bogus))
    assert result.returncode == 1
    assert result.stderr.startswith(f"kernelbridge: {bogus} is not a valid notebook")
    assert result.stderr.count("\n") == 1
