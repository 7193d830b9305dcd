"""The Hub against real third-party MCP servers installed by scripts/setup.sh (no network needed):
``mcp-server-time`` (PyPI, Python MCP SDK) and ``@modelcontextprotocol/server-everything`` (npm,
TypeScript SDK, 2025 protocol)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from bridge_harness import children

from kernelbridge.config import load_settings
from kernelbridge.errors import HubError, RpcError
from kernelbridge.hub import Hub, RpcCall

pytestmark = [pytest.mark.anyio, pytest.mark.hub]

REPO = Path(__file__).resolve().parents[2]
EVERYTHING = REPO / ".cache/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
TIMEOUT = 60.0
"""Bound on any one hub call here (a cold node or python server starts in about a second)."""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    if shutil.which("node") is None or not EVERYTHING.is_file():
        pytest.skip("node or @modelcontextprotocol/server-everything is missing (run scripts/setup.sh)")
    servers = {
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
        "everything": {
            "command": "node",
            "args": [str(EVERYTHING), "stdio"],
            "env": {"EVERYTHING_TOKEN": "s3cret-value"},
            "description": "MCP reference server",
        },
    }
    (tmp_path / "MCPs").mkdir()
    (tmp_path / "MCPs" / "peers.json").write_text(json.dumps({"mcpServers": servers}))
    return {
        **os.environ,
        "HOME": str(tmp_path),
        "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"),
        "KERNELBRIDGE_DENY_TOOLS": "everything.get-env,everything.trigger-*",
    }


@pytest.fixture
async def hub(env: dict[str, str]) -> AsyncIterator[Hub]:
    async with Hub(load_settings(env), env=env) as hub:
        yield hub


async def call(hub: Hub, method: str, grants: tuple[str, ...] = (), **params: Any) -> Any:
    with anyio.fail_after(TIMEOUT):
        return await hub.dispatch(RpcCall("s1", frozenset(grants), method, params))


async def error(hub: Hub, method: str, grants: tuple[str, ...] = (), **params: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        await call(hub, method, grants, **params)
    return info.value


async def test_calls_through_dispatch(hub: Hub) -> None:
    grants = tuple(hub.validate_grants(["time", "everything"]))
    paris = {"timezone": "Europe/Paris"}
    result = await call(hub, "call_tool", grants, server="time", tool="get_current_time", arguments=paris)
    assert result["isError"] is False and set(result) == {"content", "structuredContent", "isError"}
    assert result["structuredContent"]["timezone"] == "Europe/Paris"
    assert result["content"][0]["type"] == "text"
    # The alias of "get-sum" is get_sum; results are plain JSON.
    sum_args = {"a": 2, "b": 3}
    result = await call(hub, "call_tool", grants, server="everything", tool="get_sum", arguments=sum_args)
    assert "5" in result["content"][0]["text"]
    json.dumps(result)
    # A tool-level error is a normal result, not an exception.
    result = await call(
        hub, "call_tool", grants, server="time", tool="get_current_time", arguments={"timezone": "Mars/Base"}
    )
    assert result["isError"] is True


async def test_grants(hub: Hub) -> None:
    with pytest.raises(HubError, match="unknown server 'weather'; configured servers: time, everything"):
        hub.validate_grants(["weather"])
    exc = await error(hub, "call_tool", ("time",), server="everything", tool="echo", arguments={})
    assert (exc.kind, exc.message) == ("not_available", "Server 'everything' is not available")
    manifest = await call(hub, "manifest", ("time",))
    assert [s["name"] for s in manifest["servers"]] == ["time"]
    assert {t["name"] for t in manifest["servers"][0]["tools"]} == {"get_current_time", "convert_time"}


async def test_denied_tools_are_absent_and_refused(hub: Hub) -> None:
    grants = ("everything",)
    names = {t["name"] for t in (await call(hub, "list_tools", server="everything"))["tools"]}
    assert "echo" in names and "get-env" not in names
    assert not any(name.startswith("trigger-") for name in names)
    manifest_tools = {t["name"] for t in (await call(hub, "manifest", grants))["servers"][0]["tools"]}
    assert manifest_tools == names
    exc = await error(hub, "call_tool", grants, server="everything", tool="get-env", arguments={})
    assert exc.message == "Tool 'get-env' of server 'everything' is denied by the operator"
    assert exc.kind == "denied"
    # By its alias too.
    exc = await error(hub, "call_tool", grants, server="everything", tool="get_env", arguments={})
    assert exc.kind == "denied"
    exc = await error(hub, "query_tool_docs", server="everything", tool="get-env")
    assert exc.kind == "denied"
    hits = await call(hub, "search_tool_docs", query="environment variables", limit=50)
    assert "get-env" not in {h["tool"] for h in hits["results"]}
    exc = await error(hub, "call_tool", grants, server="everything", tool="no_such_tool", arguments={})
    assert (exc.kind, exc.message) == ("unknown_tool", "Server 'everything' has no tool 'no_such_tool'")


async def test_docs_and_search_without_a_grant(hub: Hub) -> None:
    described = await call(hub, "describe_server", server="everything")
    assert described["description"] == "MCP reference server" and described["granted"] is False
    assert described["transport"] == "stdio"
    docs = await call(hub, "query_tool_docs", server="time", tool="get_current_time", detail="full")
    (doc,) = docs["docs"]
    assert doc["signature"] == "get_current_time(*, timezone: str) -> dict"
    assert doc["output_schema"] is not None
    summary = await call(hub, "query_tool_docs", server="everything")
    assert {d["alias"] for d in summary["docs"]} >= {"echo", "get_sum", "get_tiny_image"}
    assert all("\n" not in d["description"] for d in summary["docs"])
    hits = (await call(hub, "search_tool_docs", query="current time"))["results"]
    assert hits[0]["tool"] == "get_current_time" and hits[0]["server"] == "time"
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    hits = (await call(hub, "search_tool_docs", query="echo", limit=1))["results"]
    assert [(h["server"], h["tool"]) for h in hits] == [("everything", "echo")]
    detailed = await call(hub, "discovered_servers", detailed=True)
    assert [s["name"] for s in detailed["servers"]] == ["time", "everything"]
    assert all(s["tools"] and "error" not in s for s in detailed["servers"])


async def test_secrets_never_appear_in_any_result(hub: Hub) -> None:
    grants = ("time", "everything")
    answers = [
        await call(hub, "manifest", grants),
        await call(hub, "discovered_servers", detailed=True),
        await call(hub, "describe_server", server="everything"),
        await call(hub, "list_tools", server="everything"),
        await call(hub, "query_tool_docs", server="everything", detail="full"),
        await call(hub, "search_tool_docs", query="everything token env", limit=50),
        await call(hub, "call_tool", grants, server="everything", tool="echo", arguments={"message": "hi"}),
    ]
    text = json.dumps(answers)
    assert "s3cret-value" not in text and "EVERYTHING_TOKEN" not in text
    assert str(EVERYTHING) not in text and "node" not in text.replace("nodes", "")


async def test_clean_shutdown_leaves_no_child_process(env: dict[str, str]) -> None:
    # Other fixtures of this process (a podman service, another module's bridge) are children too.
    before = set(children(os.getpid(), zombies=False))
    async with Hub(load_settings(env), env=env) as hub:
        await call(hub, "discovered_servers", detailed=True)  # starts both servers
        pids = [pid for pid in children(os.getpid(), zombies=False) if pid not in before]
        assert len(pids) >= 2
    assert not [pid for pid in pids if alive(pid)]
    assert set(children(os.getpid(), zombies=False)) <= before


async def test_stderr_goes_to_a_bounded_log(hub: Hub, env: dict[str, str]) -> None:
    await call(hub, "list_tools", server="everything")
    with anyio.fail_after(10):
        while True:  # stderr is drained by its own task: wait for the first line
            if hub.client("everything").stderr_tail():
                break
            await anyio.sleep(0.05)
    assert any("STDIO" in line for line in hub.client("everything").stderr_tail())
    log_file = Path(env["KERNELBRIDGE_STATE_DIR"]) / "logs" / "hub" / "everything.log"
    assert "STDIO" in log_file.read_text()
    assert log_file.stat().st_mode & 0o077 == 0
