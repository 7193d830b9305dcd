"""Per-call approval by MCP elicitation, with the SDK's real client and a real bridge, sandbox and
host server (the edge server): ``KERNELBRIDGE_APPROVE_TOOLS=edge.echo``.

Both ways a client can be asked are covered, over stdio and streamable HTTP: a handshake-era
client (``mode="legacy"``: a server-to-client ``elicitation/create`` while ``run_python`` waits) and
a 2026-07-28 one (the SDK's default: ``run_python`` returns an ``InputRequiredResult`` and the
client retries with the answer, which the SDK's client does by itself). For each: accept,
decline, cancel, a malformed answer, an answer that comes after the cell's timeout, a client with
no elicitation callback, a call outside the list, and every decision in the journal; and a cell
sent by an attached Jupyter client, where no MCP client waits.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from bridge_harness import KERNELBRIDGE, free_port, notebook_of, serve_params
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from waiting import hang_guard

pytestmark = [pytest.mark.podman, pytest.mark.slow]

EDGE = Path(__file__).resolve().parents[1] / "peers" / "edge_server.py"
CALL = """
try:
    r = await mcp_edge.echo(text="hello approval")
    print("RESULT", r["content"][0]["text"])
except Exception as e:
    print("ERR", type(e).__name__, e)
"""
OTHER = 'print("LEN", (await mcp_edge.length(text="abc"))["content"][0]["text"])'


class Person:
    """The elicitation callback: answers as told, and keeps what it was asked."""

    def __init__(self) -> None:
        self.answer: Any = types.ElicitResult(action="accept")
        self.delay = 0.0
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: Any) -> Any:
        self.asked.append(params)
        if self.delay:
            await anyio.sleep(self.delay)
        return self.answer


def env_for(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"edge": {"command": sys.executable, "args": [str(EDGE)]}}}))
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "KERNELBRIDGE_SERVERS_CONFIG": str(config),
        "KERNELBRIDGE_CLIENT_CONFIGS": "none",
        "KERNELBRIDGE_APPROVE_TOOLS": "edge.echo",
    }


@asynccontextmanager
async def stdio_client(tmp_path: Path, mode: str, person: Person | None) -> AsyncIterator[Client]:
    params = serve_params(tmp_path / "state", **env_for(tmp_path))
    async with Client(params, mode=mode, elicitation_callback=person, read_timeout_seconds=120) as client:
        yield client


@asynccontextmanager
async def http_client(tmp_path: Path, mode: str, person: Person | None) -> AsyncIterator[Client]:
    port = free_port()
    environ = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"), **env_for(tmp_path)}
    argv = [str(KERNELBRIDGE), "serve", "--http", "--no-auth", "--port", str(port)]
    async with await anyio.open_process(argv, env=environ, stdin=None, stdout=None, stderr=None) as proc:
        try:
            with anyio.fail_after(60):
                while True:
                    try:
                        await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                        break
                    except OSError:
                        await anyio.sleep(0.05)
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp")
            async with Client(
                transport, mode=mode, elicitation_callback=person, read_timeout_seconds=120
            ) as client:
                yield client
        finally:
            proc.terminate()
            with anyio.fail_after(60):
                await proc.wait()


async def cell(client: Client, code: str, **args: Any) -> tuple[str, dict[str, Any]]:
    result = await client.call_tool("run_python", {"code": code, "servers": ["edge"], **args})
    text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
    return text, result.structured_content or {}


def journal_approvals(client_text: str) -> list[str | None]:
    notebook = json.loads(client_text)
    found = []
    for c in notebook["cells"]:
        for call in c["metadata"].get("kernelbridge", {}).get("tool_calls", []):
            found.append(call.get("approval"))
    return found


TRANSPORTS = {"stdio": stdio_client, "http": http_client}


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_person_approves_each_call(
    tmp_path: Path, sandbox_image: str, mode: str, transport: str
) -> None:
    person = Person()
    async with TRANSPORTS[transport](tmp_path, mode, person) as client:
        # accept: the call runs; the question names the session, the tool and the arguments.
        text, _ = await cell(client, CALL, session="s1")
        assert "RESULT hello approval" in text, text
        (asked,) = person.asked
        assert asked.message == (
            'Code in session \'s1\' wants to call edge.echo with {"text": "hello approval"}: allow it?'
        )
        assert asked.requested_schema["properties"]["approve"]["type"] == "boolean"
        # decline and cancel raise the tool-denied error in the sandbox.
        person.answer = types.ElicitResult(action="decline")
        text, _ = await cell(client, CALL, session="s1")
        assert "ERR McpToolDenied edge.echo needs a person's approval (KERNELBRIDGE_APPROVE_TOOLS)" in text
        assert "the person declined it; the call was not made" in text
        person.answer = types.ElicitResult(action="cancel")
        text, _ = await cell(client, CALL, session="s1")
        assert "ERR McpToolDenied" in text and "dismissed the question" in text
        # accepting with the box unticked is a no; an answer to another question is malformed.
        person.answer = types.ElicitResult(action="accept", content={"approve": False})
        assert "the person declined it" in (await cell(client, CALL, session="s1"))[0]
        person.answer = types.ElicitResult(action="accept", content={"approve": "yes please"})
        text, _ = await cell(client, CALL, session="s1")
        assert "ERR McpToolDenied" in text and "not a valid answer" in text
        # A call outside the list asks nobody.
        before = len(person.asked)
        assert "LEN 3" in (await cell(client, OTHER, session="s1"))[0]
        assert len(person.asked) == before
        # An answer that comes after the cell's timeout: the wait was the cell's, bounded by it (a
        # wait past it would take the late yes and print RESULT hello).
        person.answer, person.delay = types.ElicitResult(action="accept"), 6.0
        with hang_guard(60, "a cell whose call waits on a slow person"):
            text, structured = await cell(client, CALL, session="s1", timeout=3)
        assert "RESULT hello" not in text
        assert structured["status"] in ("error", "timeout"), structured
        person.delay = 0.0
        approvals = journal_approvals(await notebook_of(client, "s1"))
    assert approvals == ["accepted", "declined", "cancelled", "declined", "malformed", None, "unanswered"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_that_cannot_ask_gets_a_clear_refusal(
    tmp_path: Path, sandbox_image: str, mode: str
) -> None:
    async with stdio_client(tmp_path, mode, None) as client:
        text, _ = await cell(client, CALL)
        assert "ERR McpToolDenied" in text
        assert (
            "the MCP client running this cell cannot ask its user (it does not support elicitation)" in text
        )
        assert "KERNELBRIDGE_APPROVE_TOOLS" in text
        assert "LEN 3" in (await cell(client, OTHER))[0]


@pytest.mark.anyio
async def test_a_cell_of_an_attached_jupyter_client_is_refused(tmp_path: Path, sandbox_image: str) -> None:
    from jupyter_client.blocking import BlockingKernelClient

    person = Person()
    async with stdio_client(tmp_path, "legacy", person) as client:
        await cell(client, "x = 1")  # the session exists and its proxies are bound
        state = tmp_path / "state"
        env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state)}
        listed = await anyio.run_process([str(KERNELBRIDGE), "sessions", "--json"], env=env)
        (record,) = json.loads(listed.stdout)
        kc = BlockingKernelClient(connection_file=record["connection_file"])
        kc.load_connection_file()
        kc.start_channels()
        try:
            outputs: list[str] = []

            def keep(msg: dict[str, Any]) -> None:
                if msg["msg_type"] == "stream":
                    outputs.append(msg["content"]["text"])

            await anyio.to_thread.run_sync(lambda: kc.execute_interactive(CALL, output_hook=keep, timeout=60))
        finally:
            kc.stop_channels()
    text = "".join(outputs)
    assert "ERR McpToolDenied" in text and "no MCP client is waiting on the cell that made the call" in text
    assert person.asked == []
