"""`kernelbridge serve --http` for more than one person: real HTTP clients against a real bridge.

Raw requests (httpx2) check the door: no token, a wrong token, DNS rebinding (Host and Origin),
refused binds. The MCP SDK's streamable HTTP client checks what is behind it: two tokens get
separate sessions, journals and containers, and an MCP session id is useless with another token.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anyio.abc import Process
from bridge_harness import free_port, uses_state_dir
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from kernelbridge.session.store import SessionStore

pytestmark = [pytest.mark.anyio]

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
ALICE = "alice-0123456789abcdef-secret"
BOB = "bob-fedcba9876543210-secret"
TOKENS = f"alice:{ALICE},bob:{BOB}"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
START_TIMEOUT = 30.0
STOP_TIMEOUT = 40.0


async def wait_listening(port: int, proc: Process) -> None:
    with anyio.fail_after(START_TIMEOUT):
        while True:
            assert proc.returncode is None, "kernelbridge serve --http exited"
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


class Bridge:
    """A running `kernelbridge serve --http` of a test."""

    def __init__(self, port: int, proc: Process) -> None:
        self.port = port
        self.proc = proc
        self.stopped: tuple[int, str] | None = None

    async def stop(self) -> tuple[int, str]:
        """SIGTERM (once), then its exit status and everything it wrote on stderr.

        Never signal a process that may have exited already: Popen.send_signal polls, which reaps
        it behind asyncio's child watcher, and the status then reads 255.
        """
        if self.stopped is None:
            self.proc.send_signal(signal.SIGTERM)
            err = b""
            assert self.proc.stderr is not None
            with anyio.fail_after(STOP_TIMEOUT):
                async for chunk in self.proc.stderr:
                    err += chunk
                status = await self.proc.wait()
            self.stopped = (status, err.decode(errors="replace"))
        return self.stopped


@asynccontextmanager
async def bridge(state: Path, *args: str, **env: str) -> AsyncIterator[Bridge]:
    """A `kernelbridge serve --http` on a free loopback port, stopped with SIGTERM afterwards
    (it must then exit 0)."""
    port = free_port()
    environ = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(uses_state_dir(state)), **env}
    argv = [str(KERNELBRIDGE), "serve", "--http", "--port", str(port), *args]
    async with await anyio.open_process(argv, env=environ, stdin=None, stdout=None, stderr=-1) as proc:
        running = Bridge(port, proc)
        try:
            await wait_listening(port, proc)
            yield running
        finally:
            status, err = await running.stop()
            assert status == 0, f"the bridge exited with {status}: {err[-2000:]}"


def mcp_client(port: int, token: str | None) -> Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    http = create_mcp_http_client(headers=headers)
    return Client(
        streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http), read_timeout_seconds=120
    )


async def post(port: int, headers: dict[str, str], body: Any = INITIALIZE) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(f"http://127.0.0.1:{port}/mcp", json=body, headers={**MCP_HEADERS, **headers})


# -- the door (no sandbox needed) ---------------------------------------------------------------------
async def test_no_token_and_a_wrong_token_are_refused(tmp_path: Path) -> None:
    async with bridge(tmp_path / "state", KERNELBRIDGE_HTTP_TOKENS=TOKENS) as running:
        port = running.port
        missing = await post(port, {})
        wrong = await post(port, {"authorization": "Bearer alice-0123456789abcdef-secreT"})
        basic = await post(port, {"authorization": f"Basic {ALICE}"})
        right = await post(port, {"authorization": f"Bearer {ALICE}"})
    for response in (missing, wrong, basic):
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200, right.text
    assert right.headers.get("mcp-session-id")


async def test_dns_rebinding_is_refused_with_a_valid_token(tmp_path: Path) -> None:
    token = {"authorization": f"Bearer {ALICE}"}
    async with bridge(tmp_path / "state", KERNELBRIDGE_HTTP_TOKENS=TOKENS) as running:
        port = running.port
        rebound = await post(port, {**token, "host": f"evil.example:{port}"})
        from_page = await post(port, {**token, "origin": "http://evil.example"})
        same_origin = await post(port, {**token, "origin": f"http://localhost:{port}"})
    assert rebound.status_code == 421
    assert from_page.status_code == 403
    assert same_origin.status_code == 200


async def test_allowed_hosts_apply_to_a_loopback_bind_too(tmp_path: Path) -> None:
    """With an explicit list, only those names pass (a proxy's public name, say)."""
    token = {"authorization": f"Bearer {ALICE}"}
    state = tmp_path / "state"
    async with bridge(state, "--allowed-host", "kb.example", KERNELBRIDGE_HTTP_TOKENS=TOKENS) as running:
        port = running.port
        proxied = await post(port, {**token, "host": "kb.example", "origin": "https://kb.example"})
        direct = await post(port, {**token, "host": f"127.0.0.1:{port}"})
    assert proxied.status_code == 200
    assert direct.status_code == 421


def test_a_non_loopback_bind_without_auth_is_refused(tmp_path: Path) -> None:
    """The command line's answer (other refused combinations: tests/unit/test_http_options.py)."""
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(
        [str(KERNELBRIDGE), "serve", "--http", "--host", "0.0.0.0", "--no-auth", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "kernelbridge: refusing to serve 0.0.0.0 without authentication"
    )


async def test_a_token_is_generated_once_and_kept_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with bridge(state) as first:
        token = (state / "http-token").read_text().strip()
        assert stat.S_IMODE((state / "http-token").stat().st_mode) == 0o600
        assert (await post(first.port, {"authorization": f"Bearer {token}"})).status_code == 200
        assert (await post(first.port, {})).status_code == 401
    assert first.stopped is not None and token in first.stopped[1]
    async with bridge(state) as second:
        assert (await post(second.port, {"authorization": f"Bearer {token}"})).status_code == 200
    assert second.stopped is not None
    assert token not in second.stopped[1], "the token is printed at its first start only"


# -- behind the door: real sessions ----------------------------------------------------------------
@pytest.mark.podman
async def test_two_tokens_never_share_sessions(tmp_path: Path, sandbox_image: str) -> None:
    state = tmp_path / "state"
    async with bridge(state, KERNELBRIDGE_HTTP_TOKENS=TOKENS) as running:
        port = running.port
        async with mcp_client(port, ALICE) as alice, mcp_client(port, BOB) as bob:
            mine = await alice.call_tool("run_python", {"code": "secret = 'alice'; secret"})
            assert mine.structured_content["result"] == "'alice'"
            # Same session name, another client: a different kernel.
            theirs = await bob.call_tool("run_python", {"code": "secret"})
            assert theirs.structured_content["status"] == "error"
            assert theirs.structured_content["error"]["ename"] == "NameError"
            alice_sessions = json.loads((await alice.call_tool("list_sessions", {})).content[0].text)
            bob_sessions = json.loads((await bob.call_tool("list_sessions", {})).content[0].text)
            [alice_default] = alice_sessions["sessions"]
            [bob_default] = bob_sessions["sessions"]
            assert alice_default["container"] != bob_default["container"]
            # Named for its namespace, whether the warm pool started it or the call did.
            assert alice_default["container"].startswith("kernelbridge-alice-")
            # Bob's notebook holds Bob's cell only; Alice's code is not in anything Bob can read.
            notebook = await bob.read_resource("kernelbridge://sessions/default/notebook")
            assert "secret = 'alice'" not in notebook.contents[0].text
            exported = await bob.call_tool("export_notebook", {"session": "default"})
            assert exported.structured_content["cells"] == 1  # Bob's one cell, not Alice's
            assert exported.structured_content["bytes"] == len(notebook.contents[0].text.encode())
            escape = await bob.call_tool(
                "export_notebook", {"session": "default", "path": "../../../x.ipynb"}
            )
            assert escape.is_error
            # Closing is per client too.
            closed = await bob.call_tool("close_session", {"session": "default"})
            assert "closed" in closed.content[0].text
            still = await alice.call_tool("run_python", {"code": "secret"})
            assert still.structured_content["result"] == "'alice'"
            names = podman_names("kernelbridge.namespace=alice")
            assert names and all(name.startswith("kernelbridge-alice-") for name in names)
            assert not podman_names("kernelbridge.session=default")  # labels do not collide either
            # The operator sees every namespace's sessions (Bob's is closed by now).
            operator = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state)}
            listed = await anyio.run_process([str(KERNELBRIDGE), "sessions", "--json"], env=operator)
            assert [r["name"] for r in json.loads(listed.stdout)] == ["alice/default"]
    # Journals live in each namespace's own directory; nothing in the shared one.
    alice_journal = SessionStore(state / "http" / "alice", "alice").journal("default").read_text()
    bob_journal = SessionStore(state / "http" / "bob", "bob").journal("default").read_text()
    assert "secret = 'alice'" in alice_journal
    assert "secret = 'alice'" not in bob_journal
    assert not list((state / "sessions").iterdir())


@pytest.mark.podman
async def test_an_mcp_session_id_is_useless_with_another_token(tmp_path: Path, sandbox_image: str) -> None:
    async with bridge(tmp_path / "state", KERNELBRIDGE_HTTP_TOKENS=TOKENS) as running:
        port = running.port
        opened = await post(port, {"authorization": f"Bearer {ALICE}"})
        session_id = opened.headers["mcp-session-id"]
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        hijack = await post(port, {"authorization": f"Bearer {BOB}", "mcp-session-id": session_id}, call)
    assert hijack.status_code == 404


@pytest.mark.podman
async def test_limits_per_token(tmp_path: Path, sandbox_image: str) -> None:
    env = {
        "KERNELBRIDGE_HTTP_TOKENS": TOKENS,
        "KERNELBRIDGE_HTTP_MAX_SESSIONS": "1",
        "KERNELBRIDGE_HTTP_MAX_CALLS": "1",
    }
    async with bridge(tmp_path / "state", **env) as running:
        port = running.port
        async with mcp_client(port, ALICE) as alice, mcp_client(port, BOB) as bob:
            assert not (await alice.call_tool("run_python", {"code": "1"})).is_error
            second = await alice.call_tool("run_python", {"code": "1", "session": "other"})
            assert second.is_error and "too many sessions" in second.content[0].text
            # Bob's allowance is his own.
            assert not (await bob.call_tool("run_python", {"code": "1"})).is_error

            results: dict[str, Any] = {}
            running = anyio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                running.set()  # the first progress report: the call is surely in flight

            async def slow() -> None:
                code = "import time; time.sleep(6)"
                results["slow"] = await alice.call_tool(
                    "run_python", {"code": code}, progress_callback=on_progress
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                with anyio.fail_after(30):
                    await running.wait()
                results["second"] = await alice.call_tool("run_python", {"code": "2"})
            assert results["second"].is_error and "already running" in results["second"].content[0].text
            assert not results["slow"].is_error


def podman_names(label: str) -> list[str]:
    """Names of this test run's containers that carry ``label``."""
    run = f"label={os.environ['KERNELBRIDGE_LABELS']}"
    argv = ["podman", "ps", "-a", "--filter", f"label={label}", "--filter", run, "--format", "{{.Names}}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.split()
