"""A sandbox started by a plain Jupyter client has no bridge and so no host MCP servers: its
``mcp`` calls fail at once with a clear "no host MCP servers in this kernel" (the tunnel process
answers every rpc request ``unavailable``), through every entry point of the sandbox API, the
proxies that were never bound included; and the rest of the sandbox works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import nbformat
import pytest
from nbclient import NotebookClient

from kernelbridge.config import load_settings
from kernelbridge.jupyter import SandboxKernelManager, install_kernelspec
from kernelbridge.session.cell import strip_ansi

pytestmark = pytest.mark.podman

CALLS = """
import mcp
failures = []
for call in (
    lambda: runtime.discovered_servers(),
    lambda: runtime.search_tool_docs_sync("time"),
    lambda: mcp._kernelbridge_refresh(),
):
    try:
        call()
    except mcp.McpUnavailable as exc:
        failures.append(str(exc))
try:
    await runtime.call_tool("time", "get_current_time", {"timezone": "UTC"})
except mcp.McpUnavailable as exc:
    failures.append(str(exc))
print(len(failures), len(set(failures)), failures[0], sep="\\n")
print(mcp_servers, sorted(k for k in globals() if k.startswith("mcp_")))
"""
# One statement per line: the console runs each line it reads.
CONSOLE_INPUT = (
    "import mcp\n"
    "exec(\"try:\\n runtime.list_tools_sync('time')\\n"
    "except mcp.McpError as e:\\n print('kind', e.kind, '|', e)\")\n"
    "mcp_time.get_current_time.sync(timezone='UTC')\n"
    "exit\n"
)
ENTRY_POINTS = [
    # mcp_time and mcp_servers["time"] were never bound here: no hub, no grants, no proxies.
    "await mcp_time.get_current_time(timezone='UTC')",
    "mcp_time.get_current_time.sync(timezone='UTC')",
    "await mcp_servers['time'].get_current_time(timezone='UTC')",
    "from mcp.servers.time import get_current_time",
    "import mcp\nawait mcp.runtime.call_tool('time', 'get_current_time', {'timezone': 'UTC'})",
    "await runtime.call_tool('time', 'get_current_time', {'timezone': 'UTC'})",
    "runtime.describe_server('time')",
    "def greet(name):\n    return 'hi ' + name\nsave_tool(greet)",
    "from mcp.skills import greet",
]
NO_HOST = "no host MCP servers in this kernel: it was started by a plain Jupyter client"


def test_a_kernel_of_sandbox_kernel_manager_has_no_host_servers(tmp_path: Path, sandbox_image: str) -> None:
    settings = load_settings({**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CALLS)])
    km = SandboxKernelManager(settings=settings, session_name="plain")
    client = NotebookClient(nb, km=km, timeout=60, startup_timeout=120)

    async def execute() -> None:
        try:
            with anyio.fail_after(180):
                await client.async_execute()
        finally:  # nbclient shuts down only a kernel manager it created itself
            with anyio.fail_after(60):
                await km.shutdown_kernel()

    anyio.run(execute)
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    count, distinct, message, bound = text.splitlines()
    assert (count, distinct) == ("4", "1")
    assert message.startswith(NO_HOST)
    assert bound == "{} ['mcp_servers']"


def test_every_entry_point_of_the_sandbox_api_says_there_is_no_host(
    tmp_path: Path, sandbox_image: str
) -> None:
    settings = load_settings({**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in ENTRY_POINTS])
    km = SandboxKernelManager(settings=settings, session_name="plain")
    client = NotebookClient(nb, km=km, timeout=60, startup_timeout=120, allow_errors=True)

    async def execute() -> None:
        try:
            with anyio.fail_after(180):
                await client.async_execute()
        finally:
            with anyio.fail_after(60):
                await km.shutdown_kernel()

    anyio.run(execute)
    for cell in nb.cells:
        (error,) = [o for o in cell.outputs if o.output_type == "error"]
        assert error.ename == "McpUnavailable", (cell.source, error.ename, error.evalue)
        assert error.evalue.startswith(NO_HOST) and "\n" not in error.evalue, (cell.source, error.evalue)
        shown = "\n".join(error.traceback)
        assert "kernelbridge/inside" not in shown and "skipping hidden" not in shown, shown
    assert "(so mcp_time is not defined)" in nb.cells[0].outputs[-1].evalue


def test_jupyter_console_gets_the_same_clear_error(tmp_path: Path, sandbox_image: str) -> None:
    install_kernelspec(prefix=str(tmp_path / "prefix"))
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "prefix" / "share" / "jupyter"),
        "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"),
    }
    console = str(Path(sys.executable).with_name("jupyter-console"))
    result = subprocess.run(
        [console, "--kernel", "kernelbridge", "--simple-prompt"],
        input=CONSOLE_INPUT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert f"kind unavailable | {NO_HOST}" in result.stdout, result.stdout + result.stderr
    shown = strip_ansi(result.stdout + result.stderr)  # the console prints tracebacks to stderr
    assert f"McpUnavailable: {NO_HOST}" in shown and "(so mcp_time is not defined)" in shown, shown
    assert "NameError" not in shown, shown
