"""Drive `kernelbridge serve` with a third-party MCP client: the MCP inspector's CLI (Node).

Install it once with ``npm install --prefix .cache/npm @modelcontextprotocol/inspector@0.15.0``
(later releases need Node >= 22). The inspector exits 0 even when ``isError`` is true, so the
tests read its JSON output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
INSPECTOR = REPO / ".cache" / "npm" / "node_modules" / ".bin" / "mcp-inspector"
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
INSPECTOR_TIMEOUT = 90

pytestmark = [
    pytest.mark.podman,
    pytest.mark.skipif(
        not INSPECTOR.exists(),
        reason="MCP inspector not installed: "
        "npm install --prefix .cache/npm @modelcontextprotocol/inspector@0.15.0",
    ),
]


def inspector(state_dir: Path, *args: str) -> Any:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state_dir)}
    proc = subprocess.run(
        [str(INSPECTOR), "--cli", str(KERNELBRIDGE), "serve", *args],
        capture_output=True,
        text=True,
        timeout=INSPECTOR_TIMEOUT,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_inspector_lists_the_tools(tmp_path: Path, sandbox_image: str) -> None:
    listed = inspector(tmp_path, "--method", "tools/list")
    assert [t["name"] for t in listed["tools"]] == [
        "run_python",
        "list_sessions",
        "close_session",
        "export_notebook",
    ]
    compact = json.dumps(listed, separators=(",", ":"))
    print(f"\ntools/list through the inspector: {len(compact)} bytes")


def test_inspector_calls_run_python(tmp_path: Path, sandbox_image: str) -> None:
    code = "import sys\nprint('hello from', sys.platform)\n6 * 7"
    result = inspector(
        tmp_path, "--method", "tools/call", "--tool-name", "run_python", "--tool-arg", f"code={code}"
    )
    assert result["isError"] is False
    assert result["structuredContent"]["status"] == "ok"
    assert result["structuredContent"]["result"] == "42"
    assert "hello from linux" in result["content"][0]["text"]

    bad = inspector(tmp_path, "--method", "tools/call", "--tool-name", "run_python", "--tool-arg", "code=1/0")
    assert bad["isError"] is True
    assert bad["structuredContent"]["error"]["ename"] == "ZeroDivisionError"
