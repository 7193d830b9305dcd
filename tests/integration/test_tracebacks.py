"""Tracebacks for the model in a real sandbox: an error deep inside pandas comes back with the
user's line, the frame that raised and one line counting the library frames left out, compiled
ones too; a host call refused (by the operator's policy, or its arguments) shows the user's line
and the reason, nothing of kernelbridge's own code; the notebook keeps the whole traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import notebook_of

pytestmark = [pytest.mark.podman]

CODE = 'import pandas as pd\n\ndef load(name):\n    return pd.read_csv(name)\n\nframe = load("nope.csv")'


@pytest.mark.anyio
async def test_an_error_inside_pandas_costs_the_model_little(connect: Any) -> None:
    async with connect() as client:
        result = await client.call_tool("run_python", {"code": CODE})
        notebook = await notebook_of(client, "default")
    text = result.content[0].text
    error = result.structured_content["error"]
    assert error["ename"] == "FileNotFoundError"
    for shown in (text, error["traceback"]):
        assert 'frame = load("nope.csv")' in shown and "return pd.read_csv(name)" in shown
        assert "library frames (pandas) left out; the full traceback is in the session's notebook" in shown
        assert shown.count("library frames") == 1
        assert "FileNotFoundError: [Errno 2] No such file or directory: 'nope.csv'" in shown
        # read_csv's long parameter list is not in it.
        assert "keep_default_na" not in shown
    assert len(error["traceback"]) < 2000, len(error["traceback"])
    cells = json.loads(notebook)["cells"]
    (output,) = [o for o in cells[-1]["outputs"] if o["output_type"] == "error"]
    full = "\n".join(output["traceback"])
    assert "keep_default_na" in full and len(full) > 2 * len(error["traceback"])


REFUSED = {
    # the operator's policy refuses the tool: the host answers `denied`
    "denied": ("await runtime.call_tool('time', 'convert_time', {})", "McpToolDenied"),
    # a tool proxy's arguments are checked in the kernel, before anything is sent
    "arguments": ("await mcp_time.get_current_time(tz='UTC')", "TypeError"),
    "missing": ("mcp_time.get_current_time.sync()", "TypeError"),
    "not granted": ("from mcp.servers.everything import echo", "ModuleNotFoundError"),
}
COMPILED = "import io\nimport pandas as pd\n\nrows = pd.read_csv(io.StringIO('a,b\\n1,2\\n3,4,5,6\\n'))"


@pytest.mark.anyio
async def test_the_model_reads_neither_kernelbridge_frames_nor_missing_cython_source(
    connect: Any, tmp_path: Path
) -> None:
    config = tmp_path / "servers.json"
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
    config.write_text(json.dumps({"mcpServers": {"time": time_server}}))
    # A tool the operator denies is what makes the host answer `denied` (McpToolDenied).
    async with connect(
        KERNELBRIDGE_SERVERS_CONFIG=str(config), KERNELBRIDGE_DENY_TOOLS="time.convert_time"
    ) as client:
        results = {}
        for case, (code, _) in REFUSED.items():
            results[case] = await client.call_tool("run_python", {"code": code, "servers": ["time"]})
        compiled = await client.call_tool("run_python", {"code": COMPILED})
    for case, (code, ename) in REFUSED.items():
        error = results[case].structured_content["error"]
        assert error["ename"] == ename, (case, error)
        for shown in (results[case].content[0].text, error["traceback"]):
            assert code.splitlines()[-1] in shown, (case, shown)  # the user's line
            assert "kernelbridge/inside" not in shown and "skipping hidden" not in shown, (case, shown)
            assert shown.count("File ") == 0, (case, shown)  # the cell is the only frame
    error = compiled.structured_content["error"]
    assert error["ename"] == "ParserError", error
    shown = error["traceback"]
    assert "Could not get source" not in shown, shown
    # Every pandas frame before the raising one, compiled ones too, is counted in one line.
    (note,) = [line for line in shown.splitlines() if "left out" in line]
    assert note.startswith("[... ") and "library frames (pandas) left out" in note, note
    assert int(note.split()[1]) >= 6, note  # four Python frames and the Cython ones below them
    assert shown.count("File ") == 1 and "File pandas/_libs/parsers.pyx" in shown, shown
