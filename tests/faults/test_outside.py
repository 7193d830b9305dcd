"""Faults outside the sandbox: a state directory that is a file, read-only or full; a missing
image; a missing runtime; a bridge SIGKILLed mid-call; a client sending invalid unicode escapes.
The bridge answers what it can, and says what is wrong in one line, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import (
    CLIENT_TIMEOUT,
    KERNELBRIDGE,
    REPO,
    Bridge,
    fill,
    free_port,
    open_bridge,
    serve_params,
    text_of,
)
from durable_harness import wait_for, workspace_files
from engine_probe import gone
from mcp.client.client import Client

from kernelbridge.notebook.journal import JournalCell
from kernelbridge.session.store import SessionStore
from kernelbridge.testing.notebooks import read_journal

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def serve_http_once(state_dir: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kernelbridge serve --http`` on a free loopback port: with a bad state directory it must
    end by itself (an operator's terminal gets one line and exit 1)."""
    params = serve_params(state_dir)
    return subprocess.run(
        [str(KERNELBRIDGE), "serve", "--http", "--port", str(free_port())],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(params.env or {})},
        cwd=str(REPO),
        check=False,
    )


def assert_one_line_failure(done: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("kernelbridge: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]


async def assert_served_misconfigured(state_dir: Path, *words: str) -> None:
    """Over stdio an MCP client would show a server that exits as merely "failed": the bridge
    serves instead, lists its tools, and every call says the one line of what is wrong."""
    async with Client(serve_params(state_dir), read_timeout_seconds=CLIENT_TIMEOUT) as client:
        tools = await client.list_tools()
        assert "run_python" in [tool.name for tool in tools.tools]
        answer = await client.call_tool("run_python", {"code": "1", "session": "s"})
    text = text_of(answer)
    assert answer.is_error, text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert text.startswith("kernelbridge is misconfigured: "), text
    for word in words:
        assert word in text, text


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``path`` for the test, unmounted (lazily if busy) afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "kbx-test", str(path)], check=True, timeout=30)
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], check=False, timeout=30, capture_output=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


async def test_a_state_directory_that_is_a_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory")
    await assert_served_misconfigured(state, str(state), "KERNELBRIDGE_STATE_DIR")
    assert_one_line_failure(serve_http_once(state), str(state), "KERNELBRIDGE_STATE_DIR")
    assert state.read_text() == "not a directory"


async def test_a_read_only_state_directory(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "size=1m,ro") as mount:
        await assert_served_misconfigured(mount / "state", "Read-only")
        assert_one_line_failure(serve_http_once(mount / "state"), "Read-only")


async def test_a_full_state_directory_still_serves(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "full", "size=1m") as mount:
        state = mount / "state"
        state.mkdir()
        fill(mount / "filler")
        async with open_bridge(state) as bridge:
            tools = await bridge.client.list_tools()
            assert "run_python" in [tool.name for tool in tools.tools]
            result = await bridge.run("print('ran anyway')", "full")
            assert result.status == "ok" and result.stdout == "ran anyway\n", result.text
            assert "journal_failed" in result.codes, result.text
            again = await bridge.run("1", "full")
            assert again.status == "ok" and "journal_failed" not in again.codes  # said once
            await bridge.close("full")


async def test_a_missing_image(tmp_path: Path) -> None:
    async with open_bridge(
        tmp_path / "state", KERNELBRIDGE_IMAGE="localhost/kernelbridge-missing:0"
    ) as bridge:
        assert "run_python" in [tool.name for tool in (await bridge.client.list_tools()).tools]
        result = await bridge.run("1", "noimage")
    assert result.is_error and "missing" in result.text and "kernelbridge image build" in result.text
    assert "Traceback" not in result.text and len(result.text.splitlines()) == 1


async def test_a_missing_runtime(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    async with open_bridge(tmp_path / "state", PATH=str(empty)) as bridge:
        assert "run_python" in [tool.name for tool in (await bridge.client.list_tools()).tools]
        manual = await bridge.client.read_resource("kernelbridge://capabilities")
        assert "run_python" in manual.contents[0].text  # type: ignore[union-attr]
        result = await bridge.run("1", "noruntime")
    assert result.is_error and "no container runtime found" in result.text, result.text
    assert "Traceback" not in result.text


def raw_exchange(state_dir: Path, requests: list[str], wanted_ids: set[int], timeout: float = 120) -> dict:
    """Talk JSON-RPC lines to ``kernelbridge serve`` directly; return the answers by id."""
    params = serve_params(state_dir)
    proc = subprocess.Popen(
        [str(KERNELBRIDGE), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(params.env or {})},
        cwd=str(REPO),
    )
    assert proc.stdin is not None and proc.stdout is not None
    answers: dict = {}
    try:
        for line in requests:
            proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        os.set_blocking(proc.stdout.fileno(), False)
        pending = b""
        while not wanted_ids <= set(answers) and time.monotonic() < deadline:
            time.sleep(0.05)
            chunk = proc.stdout.read() or b""
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                message = json.loads(raw)
                if "id" in message:
                    answers[message["id"]] = message
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return answers


def test_a_request_with_lone_surrogate_escapes_is_answered(tmp_path: Path) -> None:
    call = (
        '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_python",'
        '"arguments":{"code":"print(\'\\ud800 ok\')","session":"surrogate"}}}'
    )
    listing = '{"jsonrpc":"2.0","id":3,"method":"tools/list"}'
    answers = raw_exchange(
        tmp_path / "state", [json.dumps(INITIALIZE), json.dumps(INITIALIZED), call, listing], {2, 3}
    )
    assert 2 in answers, answers
    result = answers[2]["result"]
    assert result["isError"] is False and result["structuredContent"]["stdout"] == "\ufffd ok\n", result


async def test_a_bridge_killed_mid_call_leaves_journals_and_the_next_bridge_adopts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(Exception):  # noqa: B017 - the client loses its server: any error
        async with open_bridge(state) as bridge:
            await bridge.run("x = 1\nprint('journalled')", "victim")
            container = await bridge.container("victim")

            async def kill_mid_cell(bridge: Bridge) -> None:
                await wait_for(lambda: "started" in workspace_files(container), "the cell began")
                os.kill(bridge.pid, signal.SIGKILL)

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_mid_cell, bridge)
                code = "open('/workspace/started', 'w').close()\nimport time; time.sleep(8); y = 2"
                await bridge.run(code, "victim")
    # The journal of the finished cell survived the SIGKILL.
    entries = read_journal(SessionStore(state).journal("victim"))
    cells = [e for e in entries if isinstance(e, JournalCell)]
    assert cells and cells[0].code == "x = 1\nprint('journalled')"
    # The sandbox ran on (durable sessions, the default) and the cell in flight finished there;
    # the next bridge on the same state adopts it with its variables and serves again.
    async with open_bridge(state) as bridge:
        kept = await bridge.run("print(x + y)", "victim")
        assert kept.stdout == "3\n", kept.text
        assert await bridge.container("victim") == container
        assert "journalled" in await bridge.notebook("victim")
        assert (await bridge.run("1", "after")).status == "ok"
        await bridge.close("victim")
        await bridge.close("after")
    assert await gone(container)
