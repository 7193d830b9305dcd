"""A real ``kernelbridge serve`` with real host MCP servers, for the end-to-end tests
(``tests/integration/test_host_mcp*.py``). Imported as ``peers.host_bridge`` (``tests/`` is on
``sys.path``, as for ``sandbox_kernel_fixture``).

:func:`write_host_config` lays out a fake home directory and config files the way a user would
(``~/MCPs``, ``~/.config/mcp/servers``, ``KERNELBRIDGE_SERVERS_CONFIG``, ``--servers-config``),
with third-party servers installed by ``scripts/setup.sh`` (``mcp-server-time`` from PyPI,
``@modelcontextprotocol/server-everything`` from npm), the project's edge server over stdio and
over streamable HTTP, a malformed file and an entry that would launch kernelbridge itself.
:func:`open_bridge` spawns the bridge over stdio with the MCP SDK's client, exactly as an MCP host
would. Nothing here needs the network.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from bridge_harness import free_port, serve_params, text_of
from mcp.client.client import Client

REPO = Path(__file__).resolve().parents[2]
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
EDGE = REPO / "tests" / "peers" / "edge_server.py"
EVERYTHING = REPO / ".cache/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
CLIENT_TIMEOUT = 120.0
"""Bound on one MCP request to the bridge (a cold sandbox and a cold host server: a few seconds)."""

# Secrets a host server is configured with. Tests look for them inside sandboxes; they are kept
# reversed in test code (see ``hidden``) so that a cell's own source never contains them.
ENV_SECRET = "hunter2-env-" + "7f3a9c"
HEADER_SECRET = "hunter2-header-" + "41d2e8"
EVERYTHING_SECRET = "s3cret-" + "everything-5b1c"


@dataclass(frozen=True, slots=True)
class HostConfig:
    """Where a test's host MCP set-up lives."""

    root: Path
    home: Path
    state_dir: Path
    edge_state: Path
    """``EDGE_STATE_DIR`` of the edge servers: what their ``wait`` calls went through."""
    env_file: Path
    """Given in ``KERNELBRIDGE_SERVERS_CONFIG``."""
    arg_file: Path
    """Given with ``--servers-config``."""
    http_url: str


class HttpEdge:
    """The edge server as a remote (streamable HTTP) MCP server on 127.0.0.1, a real process."""

    def __init__(self, port: int, state_dir: Path | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.state_dir = state_dir
        """Where the edge server keeps its marks (None: its own default)."""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or start again: a test restarts it) and wait until it listens."""
        state = {"EDGE_STATE_DIR": str(self.state_dir)} if self.state_dir is not None else {}
        self.process = subprocess.Popen(
            [sys.executable, str(EDGE), "--http", "--port", str(self.port), "--name", "edge-http"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **state},
        )
        deadline = time.monotonic() + 30
        while True:  # a listening socket is the only readiness signal an HTTP server gives
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the HTTP edge server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)


def peers_missing() -> str | None:
    """Why the third-party peers cannot run here, or None."""
    if shutil.which("node") is None or not EVERYTHING.is_file():
        return "node or @modelcontextprotocol/server-everything is missing (run scripts/setup.sh)"
    try:
        import mcp_server_time  # noqa: F401
    except ImportError:
        return "mcp-server-time is not installed (run scripts/setup.sh)"
    return None


@contextmanager
def host_with_remote_edge(root: Path) -> Iterator[HostConfig]:
    """:func:`write_host_config` under ``root`` with its remote ``edge-http`` server running."""
    port = free_port()
    config = write_host_config(root, f"http://127.0.0.1:{port}/mcp")
    remote = HttpEdge(port, config.edge_state)
    remote.start()
    try:
        yield config
    finally:
        remote.stop()


def write_host_config(root: Path, http_url: str) -> HostConfig:
    """Config files as a user would have them; the servers, in configuration order:
    ``time, everything, victim, edge, edge-http, dead``.

    - ``~/MCPs/peers.json``: time (overridden below) and everything (with a secret ``env``);
    - ``~/MCPs/broken.json``: not JSON (reported, skipped; the rest load);
    - ``~/.config/mcp/servers/self.json``: an entry that launches ``kernelbridge serve`` (skipped);
    - ``~/.config/mcp/servers/victim.json``: an edge server for tests that kill it;
    - ``KERNELBRIDGE_SERVERS_CONFIG``: edge (stdio, secret env) and edge-http (remote, secret header);
    - ``--servers-config``: time again, replacing the home directory's definition (later wins),
      and dead, whose command exits at once.
    """
    home, state_dir, edge_state, config = root / "home", root / "state", root / "edge", root / "config"
    for directory in (home / "MCPs", home / ".config/mcp/servers", edge_state, config):
        directory.mkdir(parents=True, exist_ok=True)
    node = shutil.which("node") or "node"
    edge_env = {"EDGE_STATE_DIR": str(edge_state)}

    def write(path: Path, servers: dict[str, Any]) -> Path:
        path.write_text(json.dumps({"mcpServers": servers}, indent=1))
        return path

    write(
        home / "MCPs/peers.json",
        {
            "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"], "description": "old"},
            "everything": {
                "command": node,
                "args": [str(EVERYTHING), "stdio"],
                "env": {"EVERYTHING_TOKEN": EVERYTHING_SECRET},
                "description": "The MCP reference server: echo, sums, images, resources",
            },
        },
    )
    (home / "MCPs/broken.json").write_text('{"mcpServers": {"half": {"command": ')
    write(
        home / ".config/mcp/servers/self.json",
        {"kernelbridge": {"command": str(KERNELBRIDGE), "args": ["serve"]}},
    )
    write(
        home / ".config/mcp/servers/victim.json",
        {"victim": {"command": sys.executable, "args": [str(EDGE), "--name", "victim"], "env": edge_env}},
    )
    env_file = write(
        config / "edge.json",
        {
            "edge": {
                "command": sys.executable,
                "args": [str(EDGE)],
                "env": {**edge_env, "EDGE_SECRET": ENV_SECRET},
                "description": "Edge cases: slow, huge, crash, wait",
            },
            "edge-http": {
                "type": "http",
                "url": http_url,
                "headers": {"Authorization": f"Bearer {HEADER_SECRET}"},
                "description": "The edge server, remote",
            },
        },
    )
    arg_file = write(
        config / "time.json",
        {
            "time": {
                "command": sys.executable,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                "description": "Current time and timezone conversion",
            },
            "dead": {
                "command": sys.executable,
                "args": ["-c", "raise SystemExit(7)"],
                "description": "Never starts",
            },
        },
    )
    return HostConfig(root, home, state_dir, edge_state, env_file, arg_file, http_url)


@asynccontextmanager
async def open_bridge(config: HostConfig, **env: str) -> AsyncIterator[Client]:
    """``kernelbridge serve`` over stdio with ``config``'s home and files, as an MCP host runs it."""
    params = serve_params(
        config.state_dir,
        "--servers-config",
        str(config.arg_file),
        HOME=str(config.home),
        KERNELBRIDGE_SERVERS_CONFIG=str(config.env_file),
        **env,
    )
    async with Client(params, read_timeout_seconds=CLIENT_TIMEOUT) as client:
        yield client


async def run(client: Client, code: str, *, bound: float = CLIENT_TIMEOUT, **args: Any) -> Any:
    """``run_python`` with every argument given, bounded."""
    with anyio.fail_after(bound):
        return await client.call_tool("run_python", {"code": code, **args})


async def fate(edge_state: Path, key: str, *states: str, timeout: float = 30.0) -> str:
    """The edge server's record of call ``key`` in ``edge_state`` (its ``EDGE_STATE_DIR``) once it
    starts with one of ``states`` (bounded).

    There is no event to wait on across processes; the file is written atomically by the server.
    """
    path = anyio.Path(edge_state / key)
    with anyio.fail_after(timeout):
        while True:
            try:
                text = await path.read_text()
            except FileNotFoundError:
                text = ""
            if text.startswith(states):
                return text
            await anyio.sleep(0.05)


def printed(result: Any) -> Any:
    """The JSON value a cell printed on its last stdout line (cells end with ``print(json.dumps(...))``)."""
    sc = result.structured_content or {}
    assert sc.get("status") == "ok", text_of(result)
    return json.loads(sc["stdout"].strip().splitlines()[-1])


def hidden(secret: str) -> str:
    """A secret as cell source may carry it (reversed): the cell reverses it back in memory."""
    return secret[::-1]
