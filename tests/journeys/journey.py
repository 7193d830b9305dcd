"""A user of the product as the README tells them to run it, for the journey tier.

A :class:`User` has a home of their own (``~/.claude.json`` naming their MCP servers, the default
state directory ``~/.local/state/kernelbridge``) and starts ``kernelbridge serve`` exactly as an
MCP client does: the command and a few variables of their shell (HOME, PATH), nothing else. Every
``KERNELBRIDGE_*`` setting is at its default unless a journey is about that setting and says so.
The suite's run label is the one variable added: it marks this run's containers for the suite's
leftover check and changes nothing a user sees.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from bridge_harness import CLIENT_TIMEOUT, KERNELBRIDGE, Bridge, podman, serve_pids, uses_state_dir
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from kernelbridge.host.container import STATE_LABEL, state_identity

WAIT = 120.0
"""Bound on waiting for something a bridge does in the background (a warm sandbox's start on a
loaded 2-core machine, an adoption)."""


@dataclass
class User:
    """One person's machine account: a home, their MCP client's config, their shell variables."""

    home: Path
    settings: dict[str, str] = field(default_factory=dict)
    """``KERNELBRIDGE_*`` settings this user's MCP client entry sets (a journey about them)."""

    @property
    def state_dir(self) -> Path:
        """The default state directory (``$XDG_STATE_HOME/kernelbridge``, no XDG_STATE_HOME set)."""
        return self.home / ".local" / "state" / "kernelbridge"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KERNELBRIDGE_LABELS": os.environ["KERNELBRIDGE_LABELS"],
            **self.settings,
            **extra,
        }

    def claude_json(self, servers: dict[str, dict[str, Any]]) -> None:
        """Their Claude Code config (``~/.claude.json``) with ``servers`` as user-level MCP servers."""
        (self.home / ".claude.json").write_text(json.dumps({"mcpServers": servers, "numStartups": 3}))

    def serve(self, *args: str) -> StdioServerParameters:
        """``kernelbridge serve`` as their MCP client spawns it."""
        uses_state_dir(self.state_dir)
        return StdioServerParameters(command=str(KERNELBRIDGE), args=["serve", *args], env=self.env())

    async def cli(self, *args: str, stdin: str | None = None, check: bool = True) -> tuple[int, str, str]:
        """``kernelbridge ARGS`` in their shell: (status, stdout, stderr)."""
        with anyio.fail_after(WAIT):
            done = await anyio.run_process(
                [str(KERNELBRIDGE), *args],
                input=stdin.encode() if stdin is not None else None,
                env=self.env(),
                check=False,
            )
        out, err = done.stdout.decode(), done.stderr.decode()
        assert not check or done.returncode == 0, f"kernelbridge {' '.join(args)}: {err or out}"
        return done.returncode, out, err

    def sandboxes(self, *, running: bool = True) -> list[str]:
        """The containers of their state directory (running ones only unless ``running=False``)."""
        args = ["ps", "-q", "--filter", f"label={STATE_LABEL}={state_identity(self.state_dir)}"]
        return podman(*(args if running else [*args, "-a"])).split()


def new_user(tmp_path: Path, **settings: str) -> User:
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    return User(home, dict(settings))


@asynccontextmanager
async def client_of(user: User, **options: Any) -> AsyncIterator[Bridge]:
    """Their MCP client, started (and so its bridge); quits when the block ends, as a client does
    (stdin closes; the bridge lets its sessions run on). ``options`` go to the SDK's Client."""
    async with Client(user.serve(), read_timeout_seconds=CLIENT_TIMEOUT, **options) as client:
        (pid,) = serve_pids(user.state_dir)
        yield Bridge(client, user.state_dir, pid)


async def warm_pool_ready(bridge: Bridge, size: int = 1) -> None:
    """What a client that waits for the warm pool does: poll ``list_sessions`` (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            _, text = await bridge.call("list_sessions")
            if json.loads(text)["warm"] >= size:
                return
            await anyio.sleep(0.2)


async def until(condition: Any, what: str, timeout: float = WAIT) -> None:
    """Poll ``condition()`` (an engine query: nothing else to wait on) until it holds."""
    with anyio.move_on_after(timeout):
        while True:
            if condition():
                return
            await anyio.sleep(0.1)
    raise AssertionError(f"not within {timeout:g} s: {what}")


PYTHON = sys.executable
TIME_SERVER = {"command": PYTHON, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
"""mcp-server-time (PyPI), as a user's ``~/.claude.json`` names it."""


@asynccontextmanager
async def http_clients_of(user: User, tokens: dict[str, str]) -> AsyncIterator[dict[str, Bridge]]:
    """``kernelbridge serve --http`` in their shell with ``tokens`` (``KERNELBRIDGE_HTTP_TOKENS``:
    what an HTTP journey is about), and one MCP client over streamable HTTP per token; the server
    gets SIGTERM afterwards, as a service manager stops it, and must exit 0."""
    from bridge_harness import free_port
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    port = free_port()
    uses_state_dir(user.state_dir)
    env = user.env(KERNELBRIDGE_HTTP_TOKENS=",".join(f"{name}:{token}" for name, token in tokens.items()))
    argv = [str(KERNELBRIDGE), "serve", "--http", "--port", str(port)]
    async with await anyio.open_process(argv, env=env, stdin=None, stdout=None, stderr=None) as proc:
        try:
            with anyio.fail_after(WAIT):
                while True:
                    assert proc.returncode is None, "kernelbridge serve --http exited"
                    try:
                        await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                        break
                    except OSError:
                        await anyio.sleep(0.05)
            async with AsyncExitStack() as stack:
                clients = {}
                for name, token in tokens.items():
                    http = create_mcp_http_client(headers={"authorization": f"Bearer {token}"})
                    transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
                    opened = Client(transport, read_timeout_seconds=CLIENT_TIMEOUT)
                    client = await stack.enter_async_context(opened)
                    clients[name] = Bridge(client, user.state_dir / "http" / name, proc.pid)
                yield clients
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(WAIT):
                status = await proc.wait()
            assert status == 0, f"the HTTP bridge exited with {status}"
