"""``kernelbridge demo``: a short scripted agent session, printed as a transcript.

A real MCP client (the SDK's, over stdio) spawns ``kernelbridge serve`` exactly as an agent host
would, and makes the calls an agent might: state that persists, an error, a timeout that keeps
the session, an image, a host MCP server found, searched and called from sandboxed code (the
``time`` server, mcp-server-time, when installed), and the notebook export. State lives in a
temporary directory, and every sandbox is removed when the demo ends.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

CALL_TIMEOUT = 120.0
"""Bound on one call, including a cold sandbox start."""

# A 1x1 PNG, so the demo needs no plotting library inside the sandbox.
PNG_CODE = """\
import zlib
from IPython.display import Image, display

def chunk(kind, data):
    body = kind + data
    return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0]))
       + chunk(b"IDAT", zlib.compress(b"\\0\\xff\\0\\0")) + chunk(b"IEND", b""))
display(Image(data=png))
print("displayed a", len(png), "byte PNG")
"""

FIB_CODE = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n[fib(i) for i in range(12)]"

SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("run_python", {"code": "import math\nradius = 2\narea = math.pi * radius**2\narea"}),
    ("run_python", {"code": 'print(f"the area is still here: {area:.3f}")'}),
    ("run_python", {"code": FIB_CODE}),
    ("run_python", {"code": "fib('ten')"}),
    ("run_python", {"code": "import time\nprint('working...', flush=True)\ntime.sleep(30)", "timeout": 2}),
    ("run_python", {"code": "area, fib(10)"}),
    ("run_python", {"code": "import os\nos.listdir('/workspace'), open('/etc/hostname').read().strip()"}),
    ("run_python", {"code": "x = 'scratch'", "session": "other"}),
    ("run_python", {"code": "'area' in globals()", "session": "other"}),
    ("run_python", {"code": PNG_CODE}),
    # Host MCP: the demo configures the `time` server (mcp-server-time) when it is installed.
    ("run_python", {"code": "runtime.discovered_servers()"}),
    (
        "run_python",
        {"code": "[hit['tool'] for hit in runtime.search_tool_docs_sync('convert a time between zones')]"},
    ),
    (
        "run_python",
        {
            "code": "now = await mcp_time.get_current_time(timezone='Asia/Tokyo')\nnow['structuredContent']",
            "servers": ["time"],
        },
    ),
    ("run_python", {"code": "help(mcp_time.convert_time)"}),
    ("run_python", {"code": "'Tokyo is on ' + now['structuredContent']['day_of_week']"}),
    ("list_sessions", {}),
    ("export_notebook", {"session": "default"}),
    ("close_session", {"session": "other"}),
]


def _indent(text: str, prefix: str) -> str:
    return textwrap.indent(text.rstrip("\n"), prefix, lambda _: True)


def _show_call(name: str, args: dict[str, Any]) -> None:
    extra = {k: v for k, v in args.items() if k != "code"}
    print(f"\nagent > {name}({', '.join(f'{k}={v!r}' for k, v in extra.items())})")
    if "code" in args:
        print(_indent(args["code"], "      | "))


def _show_result(name: str, result: Any, elapsed: float) -> None:
    for block in result.content:
        if block.type == "image":
            print(f"bridge > [image {block.mime_type}, {len(block.data)} base64 characters]")
        elif block.type == "text":
            print(_indent(block.text, "bridge > "))
    flag = "  [isError]" if result.is_error else ""
    print(f"         ({elapsed * 1000:.0f} ms round trip){flag}")


def _servers_config(state_dir: Path) -> list[str]:
    """``--servers-config`` for a host MCP server the demo can use offline, if installed."""
    if importlib.util.find_spec("mcp_server_time") is None:
        return []
    config = {
        "mcpServers": {
            "time": {
                "command": sys.executable,
                "args": ["-m", "mcp_server_time"],
                "description": "Current time and time zone conversions (mcp-server-time)",
            }
        }
    }
    path = state_dir / "demo-servers.json"
    path.write_text(json.dumps(config))
    return ["--servers-config", str(path)]


async def _run(state_dir: Path) -> None:
    servers = _servers_config(state_dir)
    params = StdioServerParameters(
        command=str(Path(sys.executable).with_name("kernelbridge")),
        args=["serve", *servers],
        # Its state directory goes when the demo ends, so its sessions end with the bridge: a
        # durable one would run on, detached, for a bridge that can never adopt it.
        env={**_passthrough_env(), "KERNELBRIDGE_STATE_DIR": str(state_dir), "KERNELBRIDGE_DURABLE": "0"},
    )
    print("kernelbridge demo: an MCP client spawns `kernelbridge serve` over stdio\n")
    async with Client(params, read_timeout_seconds=CALL_TIMEOUT) as client:
        tools = await client.list_tools()
        size = len(json.dumps(tools.model_dump(mode="json", by_alias=True, exclude_none=True)))
        print(f"tools: {', '.join(t.name for t in tools.tools)} ({size} bytes of tools/list)")
        for name, args in SCRIPT:
            if not servers and ("servers" in args or "mcp_time" in args.get("code", "")):
                continue  # mcp-server-time is not installed: skip the host MCP part
            _show_call(name, args)
            start = time.monotonic()
            with anyio.fail_after(CALL_TIMEOUT):
                result = await client.call_tool(name, args)
            _show_result(name, result, time.monotonic() - start)
    print("\nclient disconnected: the bridge removed every sandbox it started.")


def _passthrough_env() -> dict[str, str]:
    """Settings the user set for the bridge apply to the demo too (but for its state directory
    and durability: see :func:`_run`)."""
    return {k: v for k, v in os.environ.items() if k.startswith("KERNELBRIDGE_")}


def main() -> int:
    """Run the demo; return the process exit status."""
    with tempfile.TemporaryDirectory(prefix="kernelbridge-demo-") as state:
        try:
            anyio.run(_run, Path(state))
        except Exception as exc:  # the CLI's contract: one line, non-zero status
            print(f"kernelbridge demo failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
