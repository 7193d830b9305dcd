"""Request validation for every rpc method, grants, policy and error kinds, without starting servers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelbridge.calls.wire import check_result_size, parse_request
from kernelbridge.config import load_settings
from kernelbridge.errors import HubError, RpcError
from kernelbridge.frames import MAX_RPC_BYTES, MAX_RPC_IN_FLIGHT
from kernelbridge.hub import KINDS, METHODS, Hub, RpcCall

pytestmark = pytest.mark.anyio

BAD_PARAMS: list[tuple[str, Any, str]] = [
    ("manifest", [], "manifest: params must be a JSON object, not a list"),
    ("manifest", None, "params must be a JSON object, not null"),
    ("manifest", {"x": 1}, "manifest: unexpected parameter 'x'; parameters: none"),
    ("list_servers", {"grants": ["x"]}, "unexpected parameter 'grants'"),
    ("discovered_servers", {"detailed": 1}, "'detailed' must be true or false, not a number"),
    ("discovered_servers", {"detailed": "yes"}, "'detailed' must be true or false, not a string"),
    ("describe_server", {}, "describe_server: missing parameter 'server'"),
    ("describe_server", {"server": 3}, "'server' must be a non-empty string, not a number"),
    ("describe_server", {"server": ""}, "'server' must be a non-empty string"),
    ("describe_server", {"server": "s" * 257}, "'server' is 257 characters; the limit is 256"),
    ("list_tools", {"server": ["a"]}, "'server' must be a non-empty string, not a list"),
    ("query_tool_docs", {"server": "s", "tool": 5}, "'tool' must be a non-empty string, not a number"),
    ("query_tool_docs", {"server": "s", "detail": "all"}, "'detail' must be 'summary' or 'full'"),
    ("search_tool_docs", {}, "missing parameter 'query'"),
    ("search_tool_docs", {"query": "  "}, "'query' must be a non-empty string"),
    ("search_tool_docs", {"query": "q" * 1001}, "'query' is 1,001 characters; the limit is 1000"),
    ("search_tool_docs", {"query": "q", "limit": 0}, "'limit' must be an integer from 1 to 50"),
    ("search_tool_docs", {"query": "q", "limit": 51}, "'limit' must be an integer from 1 to 50"),
    ("search_tool_docs", {"query": "q", "limit": True}, "'limit' must be an integer from 1 to 50"),
    ("search_tool_docs", {"query": "q", "limit": 2.0}, "'limit' must be an integer from 1 to 50"),
    ("call_tool", {"server": "s"}, "call_tool: missing parameter 'tool'"),
    (
        "call_tool",
        {"server": "s", "tool": "t", "arguments": [1]},
        "'arguments' must be a JSON object, not a list",
    ),
    (
        "call_tool",
        {"server": "s", "tool": "t", "arguments": None},
        "'arguments' must be a JSON object, not null",
    ),
    ("call_tool", {"server": "s", "tool": "t", "arguments": "{}"}, "'arguments' must be a JSON object"),
    ("save_tool", {"name": "f"}, "missing parameter 'source'"),
    ("save_tool", {"name": "f", "source": 1}, "'source' must be a string, not a number"),
    ("save_tool", {"name": "f", "source": "", "description": 2}, "'description' must be a string"),
    (
        "save_tool",
        {"name": "f", "source": "", "description": "d" * 9000},
        "'description' is 9,000 characters",
    ),
    ("load_skill", {"name": None}, "'name' must be a non-empty string, not null"),
    ("list_skills", {"name": "x"}, "unexpected parameter 'name'"),
]


@pytest.mark.parametrize(("method", "params", "message"), BAD_PARAMS)
def test_bad_params(method: str, params: Any, message: str) -> None:
    with pytest.raises(RpcError) as info:
        parse_request(method, params)
    assert info.value.kind == "invalid_params"
    assert message in info.value.message
    assert "\n" not in info.value.message


def test_every_method_has_bad_params_cases() -> None:
    assert {method for method, _, _ in BAD_PARAMS} == METHODS


@pytest.mark.parametrize("method", [None, 3, "nope", "call_tool ", "__init__", "x" * 10_000])
def test_unknown_method(method: object) -> None:
    with pytest.raises(RpcError) as info:
        parse_request(method, {})
    assert info.value.kind == "invalid_params" and "unknown method" in info.value.message
    assert len(info.value.message) < 400


def test_defaults_are_filled_in() -> None:
    assert parse_request("query_tool_docs", {"server": "s"}) == (
        "query_tool_docs",
        {"server": "s", "tool": None, "detail": "summary"},
    )
    assert parse_request("search_tool_docs", {"query": "q"})[1] == {"query": "q", "limit": 5}
    assert parse_request("call_tool", {"server": "s", "tool": "t"})[1]["arguments"] == {}
    assert parse_request("discovered_servers", {})[1] == {"detailed": False}


def test_size_caps() -> None:
    ten_mb = {"text": "x" * 10_000_000}
    assert (
        parse_request("call_tool", {"server": "s", "tool": "t", "arguments": ten_mb})[1]["arguments"]
        is ten_mb
    )
    with pytest.raises(RpcError) as info:
        parse_request("call_tool", {"server": "s", "tool": "t", "arguments": {"text": "x" * MAX_RPC_BYTES}})
    assert info.value.kind == "too_large"
    with pytest.raises(RpcError) as info:
        parse_request("save_tool", {"name": "f", "source": "x" * (256 * 1024 + 1)})
    assert info.value.kind == "too_large"
    check_result_size({"content": [{"type": "text", "text": "x" * 10_000_000}]})
    with pytest.raises(RpcError) as info:
        check_result_size({"content": [{"type": "text", "text": "x" * MAX_RPC_BYTES}]})
    assert info.value.kind == "too_large" and "the cap is" in info.value.message


def test_kinds_match_the_doc() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "rpc.md").read_text()
    for kind in KINDS:
        assert f"| `{kind}` |" in doc
    for method in METHODS:
        assert f"| `{method}` |" in doc


# -- the Hub, with servers configured but never started ------------------------------------------------


@pytest.fixture
def hub_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "MCPs").mkdir()
    servers = {
        "time": {"command": "/nonexistent/never-started", "env": {"SECRET": "v"}},
        "My Files": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer t"}},
        "prod-db": {"command": "/nonexistent/never-started"},
    }
    (tmp_path / "MCPs" / "s.json").write_text(json.dumps({"mcpServers": servers}))
    return {
        "HOME": str(tmp_path),
        "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"),
        "KERNELBRIDGE_DENY_SERVERS": "prod-*",
        "KERNELBRIDGE_DENY_TOOLS": "time.secret_*",
    }


@pytest.fixture
async def hub(hub_env: dict[str, str]) -> AsyncIterator[Hub]:
    async with Hub(load_settings(hub_env), env=hub_env) as hub:
        yield hub


async def call(hub: Hub, method: object, params: object, grants: tuple[str, ...] = ()) -> Any:
    with anyio.fail_after(10):
        return await hub.dispatch(RpcCall("s1", frozenset(grants), method, params))


async def error(hub: Hub, method: object, params: object, grants: tuple[str, ...] = ()) -> RpcError:
    with pytest.raises(RpcError) as info:
        await call(hub, method, params, grants)
    return info.value


async def test_server_names_and_grants(hub: Hub) -> None:
    assert hub.server_names() == ["time", "My Files"]
    assert hub.problems() == []
    assert hub.validate_grants(["my_files", "time", "My Files"]) == ["My Files", "time"]
    with pytest.raises(HubError, match=r"unknown server 'nope'; configured servers: time, My Files"):
        hub.validate_grants(["time", "nope"])
    with pytest.raises(
        HubError, match=r"server 'prod-db' is denied by the operator \(KERNELBRIDGE_DENY_SERVERS\)"
    ):
        hub.validate_grants(["prod-db"])


async def test_no_servers_configured(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")}
    async with Hub(load_settings(env), env=env) as hub:
        with pytest.raises(HubError, match="no host MCP servers are configured"):
            hub.validate_grants(["time"])
        assert await call(hub, "manifest", {}) == {"servers": []}


async def test_docs_cost_no_grant_and_hide_secrets(hub: Hub) -> None:
    result = await call(hub, "discovered_servers", {"detailed": False}, grants=("time",))
    assert result == {
        "servers": [
            {"name": "time", "alias": "time", "description": "", "granted": True, "transport": "stdio"},
            {
                "name": "My Files",
                "alias": "my_files",
                "description": "",
                "granted": False,
                "transport": "http",
            },
        ]
    }
    assert await call(hub, "list_servers", {}, grants=("time", "gone")) == {"servers": ["time"]}
    text = json.dumps(result)
    assert "nonexistent" not in text and "Bearer" not in text and "127.0.0.1" not in text


async def test_not_available_messages(hub: Hub) -> None:
    for method, params in [
        ("call_tool", {"server": "time", "tool": "x"}),  # configured but not granted
        ("call_tool", {"server": "nope", "tool": "x"}),
        ("describe_server", {"server": "nope"}),
        ("list_tools", {"server": "prod-db"}),  # denied: as if not configured
        ("query_tool_docs", {"server": "prod-db"}),
    ]:
        exc = await error(hub, method, params)
        assert exc.kind == "not_available"
        assert exc.message == f"Server '{params['server']}' is not available"
    exc = await error(hub, "call_tool", {"server": "prod-db", "tool": "x"}, grants=("prod-db",))
    assert exc.message == "Server 'prod-db' is not available"


async def test_denied_tool_answers_denied_without_starting_the_server(hub: Hub) -> None:
    exc = await error(hub, "call_tool", {"server": "time", "tool": "secret_dump"}, grants=("time",))
    assert (exc.kind, exc.message) == (
        "denied",
        "Tool 'secret_dump' of server 'time' is denied by the operator",
    )
    assert hub.client("time").starts == 0


async def test_server_that_cannot_start(hub: Hub) -> None:
    exc = await error(hub, "call_tool", {"server": "time", "tool": "x"}, grants=("time",))
    assert exc.kind == "server_error"
    assert (
        exc.message
        == "server 'time' could not start: could not launch the command (No such file or directory)"
    )
    manifest = await call(hub, "manifest", {}, grants=("time",))
    (record,) = manifest["servers"]
    assert record["tools"] == [] and "could not start" in record["error"]
    assert "nonexistent" not in json.dumps(manifest)
    assert hub.client("time").starts == 1  # the failed start is not retried at once


async def test_busy_beyond_the_in_flight_cap(hub: Hub) -> None:
    # Fill the session's slots with calls parked on a server that never answers.
    release = anyio.Event()

    async def stalled(refresh: bool = False) -> list[Any]:
        await release.wait()
        return []

    hub.client("time").tools = stalled  # type: ignore[method-assign]
    answers: list[Any] = []

    async def one() -> None:
        answers.append(await call(hub, "list_tools", {"server": "time"}))

    async with anyio.create_task_group() as tg:
        for _ in range(MAX_RPC_IN_FLIGHT):
            tg.start_soon(one)
        await anyio.wait_all_tasks_blocked()
        exc = await error(hub, "list_servers", {})
        assert exc.kind == "busy"
        assert await hub.dispatch(RpcCall("other-session", frozenset(), "list_servers", {})) == {
            "servers": []
        }
        # Another HTTP token's session of the same name has slots of its own.
        other_tenant = RpcCall("s1", frozenset(), "list_servers", {}, namespace="bob")
        assert await hub.dispatch(other_tenant) == {"servers": []}
        release.set()
    assert answers == [{"tools": []}] * MAX_RPC_IN_FLIGHT
    assert await call(hub, "list_servers", {}) == {"servers": []}  # the slots were released


async def test_a_bug_becomes_internal(hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    async def broken(call: RpcCall, params: dict[str, Any]) -> object:
        raise KeyError("/home/secret/path")

    hub._handlers["list_servers"] = broken
    exc = await error(hub, "list_servers", {})
    assert (exc.kind, exc.message) == ("internal", "internal error in kernelbridge (logged on the host)")
    assert "KeyError" in caplog.text


def test_public_api() -> None:
    import kernelbridge.hub as hub_package

    assert set(hub_package.__all__) == {
        "KINDS", "METHODS", "ClientState", "ConfigSource", "Shadowed", "config_sources", "HttpServer",
        "Hub", "HubError", "Policy", "RpcCall", "RpcError",
        "RpcHandler", "ServerCatalog", "ServerClient", "ServerConfig", "ServerFailure", "Skill", "SkillError",
        "SkillInfo", "StdioServer", "alias", "assign_aliases", "config_files", "launches_kernelbridge",
        "list_skills", "load_catalog", "python_signature", "read_skill", "remove_skill", "save_skill",
        "tool_result",
    }  # fmt: skip
    assert all(hasattr(hub_package, name) for name in hub_package.__all__)
