"""Issue 13's attacks on the host's disk and on the person replaying a notebook: a session cannot
write more journal than its budget whatever it does, and ``kernelbridge replay`` of a notebook from
anywhere calls no live host server unless the person names it and never writes the saved tools.
Real bridges, real podman sandboxes, the ``kernelbridge`` console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from bridge_harness import KERNELBRIDGE, REPO, open_bridge
from nbformat import v4

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

EDGE = REPO / "tests" / "peers" / "edge_server.py"
BUDGET = 8 << 20
BIG_OUTPUT = """
import os, base64
from IPython.display import display
display({"image/png": base64.b64encode(os.urandom(3 << 20)).decode()}, raw=True)
print("x" * 10_000)
"""


async def test_a_session_cannot_write_more_journal_than_its_budget(
    tmp_path: Path, sandbox_image: str
) -> None:
    state = tmp_path / "state"
    async with open_bridge(state, KERNELBRIDGE_JOURNAL_BUDGET="8m") as bridge:
        codes, said = [], ""
        for _ in range(6):  # ~4 MiB a cell
            result = await bridge.run(BIG_OUTPUT, "hog")
            assert result.status == "ok", result.text
            codes.append(result.codes)
            said = result.notes if "journal_full" in result.codes else said
        journal = bridge.journal("hog")
        size = journal.stat().st_size
        after = await bridge.run(BIG_OUTPUT, "hog")
        notebook = await bridge.notebook("hog")
        await bridge.close("hog")
    assert sum(c.count("journal_full") for c in codes) == 1, codes
    assert "journal reached its budget of 8 MiB (KERNELBRIDGE_JOURNAL_BUDGET" in said
    assert "journal_full" not in after.codes  # said once
    assert size <= BUDGET + 256 and journal.stat().st_size == size  # nothing more, ever
    kinds = [json.loads(line)["type"] for line in journal.read_text().splitlines()]
    assert kinds.count("truncated") == 1 and kinds[-1] == "truncated"
    nb = nbformat.reads(notebook, as_version=4)
    assert nb.cells[-1].cell_type == "markdown" and "reached its budget" in nb.cells[-1].source
    print(f"\njournal budget 8 MiB: 7 cells of ~4.2 MiB each; the journal holds {size:,} bytes and stays so")


def edge_config(tmp_path: Path) -> tuple[Path, Path]:
    calls = tmp_path / "edge-calls"
    calls.mkdir()
    server = {"command": sys.executable, "args": [str(EDGE)], "env": {"EDGE_STATE_DIR": str(calls)}}
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"edge": server}}))
    return config, calls


def evil_notebook(path: Path) -> None:
    """A notebook "from somewhere": a host call, and a cell that saves a tool."""
    text = {
        "content": [{"type": "text", "text": "replayed waited 0"}],
        "structuredContent": None,
        "isError": False,
    }
    call = {"server": "edge", "tool": "wait", "arguments": {"key": "replayed", "seconds": 0}, "ok": True,
            "duration_ms": 3, "result": text}  # fmt: skip
    first = v4.new_code_cell(
        'r = await mcp_edge.wait(key="replayed", seconds=0)\nprint(r["content"][0]["text"])',
        outputs=[v4.new_output("stream", name="stdout", text="replayed waited 0\n")],
    )
    first.metadata["kernelbridge"] = {"servers": ["edge"], "tool_calls": [call], "status": "ok"}
    second = v4.new_code_cell(
        "def planted():\n    return 'runs in every later session that imports it'\nprint(save_tool(planted))",
        outputs=[v4.new_output("stream", name="stdout", text="saved tool 'planted'\n")],
    )
    nbformat.write(v4.new_notebook(cells=[first, second]), path)


def replay(state: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state), "KERNELBRIDGE_SERVERS_CONFIG": str(config)}
    return subprocess.run(
        [str(KERNELBRIDGE), "replay", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_a_replayed_notebook_calls_no_live_server_unless_named(tmp_path: Path, sandbox_image: str) -> None:
    config, calls = edge_config(tmp_path)
    state = tmp_path / "state"
    evil_notebook(tmp_path / "evil.ipynb")
    offline = replay(state, config, str(tmp_path / "evil.ipynb"))
    lines = offline.stdout.splitlines()
    assert lines[0].startswith("cell   1  same"), offline.stdout + offline.stderr
    assert lines[1].startswith("cell   2  error") and "McpToolDenied" in lines[1], offline.stdout
    assert offline.returncode == 1  # the save_tool cell raised
    assert list(calls.iterdir()) == []  # the host server was never called
    assert not (state / "logs" / "hub" / "edge.log").exists()  # nor even started
    assert not list(state.glob("**/skills/*.py"))  # and nothing was saved
    # Named by the person: that server is called live.
    live = replay(state, config, str(tmp_path / "evil.ipynb"), "--grant", "edge")
    assert live.stdout.splitlines()[0].startswith("cell   1  same"), live.stdout + live.stderr
    assert (calls / "replayed").read_text() == "done"
    assert "edge live" in live.stdout.splitlines()[-1]
    assert not list(state.glob("**/skills/*.py"))
    print("\nreplay: without --grant edge is never started; save_tool refused; --grant edge calls it")
