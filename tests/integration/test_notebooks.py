"""The example notebooks in ``notebooks/`` (real exported sessions) still replay the same.

``notebooks/generate.py`` regenerates them. Replays run offline (the recording is the default): the
host MCP session's tool calls are answered from the results recorded in the notebook.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.podman

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")


def replay(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KERNELBRIDGE), "replay", *args],
        capture_output=True,
        text=True,
        timeout=300,
        # No host MCP servers configured: nothing but the recording can answer a tool call.
        env={
            **os.environ,
            "KERNELBRIDGE_STATE_DIR": str(state),
            "HOME": str(state),
            "KERNELBRIDGE_SERVERS_CONFIG": "",
        },
        check=False,
    )


def test_the_examples_are_there() -> None:
    names = {path.stem for path in NOTEBOOKS}
    assert {"data-analysis", "host-mcp-tools", "error-and-timeout"} <= names
    for path in NOTEBOOKS:
        nbformat.validate(nbformat.read(path, as_version=4))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_each_example_replays_the_same(notebook: Path, tmp_path: Path, sandbox_image: str) -> None:
    result = replay(tmp_path, str(notebook), "--recorded-tools", "--strict")
    assert result.returncode == 0, result.stdout + result.stderr
    cells = sum(cell.cell_type == "code" for cell in nbformat.read(notebook, as_version=4).cells)
    assert result.stdout.splitlines()[-1].endswith(f": {cells} same, 0 different, 0 error, 0 skipped")


def test_tool_results_come_from_the_recording(tmp_path: Path, sandbox_image: str) -> None:
    nb = nbformat.read(REPO / "notebooks" / "host-mcp-tools.ipynb", as_version=4)
    first = nb.cells[0]
    (call,) = first.metadata["kernelbridge"]["tool_calls"]
    call["result"]["content"][0]["text"] = "only in the recording"
    first.outputs[0]["data"]["text/plain"] = "'only in the recording'"
    altered = tmp_path / "altered.ipynb"
    nbformat.write(nb, altered)
    offline = replay(tmp_path, str(altered), "--recorded-tools", "--strict")
    assert offline.returncode == 0, offline.stdout + offline.stderr
    # The recording is the default: no live server is called unless the person names it.
    default = replay(tmp_path, str(altered), "--strict")
    assert default.returncode == 0, default.stdout + default.stderr
    assert "host tools answered from the recording" in default.stdout.splitlines()[-1]
    # Named, it must be a configured server: here it is not, and nothing runs.
    live = replay(tmp_path, str(altered), "--grant", "edge")
    assert live.returncode == 1 and live.stdout == "", live.stdout
    assert (
        live.stderr.startswith("kernelbridge: unknown server 'edge'") and len(live.stderr.splitlines()) == 1
    )
