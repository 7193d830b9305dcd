"""Host tool calls answered from a notebook's recording (``replay --recorded-tools``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from nbformat import v4

from kernelbridge.calls import RpcCall
from kernelbridge.errors import HubError, RpcError
from kernelbridge.replay import RecordedTools, recorded_in_full

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def call(server: str, tool: str, arguments: dict[str, Any], **outcome: Any) -> dict[str, Any]:
    return {"server": server, "tool": tool, "ok": "error" not in outcome, "duration_ms": 3,
            "arguments": arguments, **outcome}  # fmt: skip


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "structuredContent": None, "isError": False}


def cell(calls: list[dict[str, Any]], servers: list[str] | None = None) -> Any:
    node = v4.new_code_cell("...")
    node.metadata["kernelbridge"] = {"servers": servers or ["My Edge"], "tool_calls": calls}
    return node


FIRST = cell([call("My Edge", "echo", {"text": "a"}, result=text("a")),
              call("My Edge", "echo", {"text": "b"}, result=text("b")),
              call("My Edge", "length", {"text": "abc", "strict": True}, result=text("3"))])  # fmt: skip
SECOND = cell([call("My Edge", "crash", {}, error="server_error: edge exited during the call")])


def rpc(method: str, **params: Any) -> RpcCall:
    return RpcCall("s", frozenset({"My Edge"}), method, params)


async def test_calls_are_answered_by_content_in_the_current_cell_only() -> None:
    tools = RecordedTools([FIRST, SECOND])
    assert tools.validate_grants(["my_edge"]) == ["My Edge"]
    with pytest.raises(HubError, match="not in the recording"):
        tools.validate_grants(["github"])
    tools.begin(FIRST)
    with anyio.fail_after(5):
        # Out of order (as concurrent calls arrive), and by alias: matched on content.
        b = await tools.dispatch(rpc("call_tool", server="my_edge", tool="echo", arguments={"text": "b"}))
        a = await tools.dispatch(rpc("call_tool", server="My Edge", tool="echo", arguments={"text": "a"}))
        assert (a, b) == (text("a"), text("b"))
        with pytest.raises(RpcError, match=r"no recorded call of My Edge\.echo") as missing:
            await tools.dispatch(rpc("call_tool", server="My Edge", tool="echo", arguments={"text": "a"}))
        assert missing.value.kind == "server_error"
        tools.begin(SECOND)
        with pytest.raises(RpcError, match="exited during the call") as failed:
            await tools.dispatch(rpc("call_tool", server="My Edge", tool="crash", arguments={}))
        assert failed.value.kind == "server_error"
        with pytest.raises(RpcError) as ungranted:
            await tools.dispatch(
                RpcCall("s", frozenset(), "call_tool", {"server": "My Edge", "tool": "crash"})
            )
        assert ungranted.value.kind == "not_available"


async def test_manifest_and_docs_describe_the_recorded_tools() -> None:
    tools = RecordedTools([FIRST, SECOND])
    with anyio.fail_after(5):
        manifest: Any = await tools.dispatch(rpc("manifest"))
        docs: Any = await tools.dispatch(
            rpc("query_tool_docs", server="my_edge", tool="length", detail="full")
        )
        found: Any = await tools.dispatch(rpc("search_tool_docs", query="length"))
        with pytest.raises(RpcError) as skills:
            await tools.dispatch(rpc("list_skills"))
    (server,) = manifest["servers"]
    assert (server["name"], server["alias"], server["granted"]) == ("My Edge", "my_edge", True)
    assert [t["name"] for t in server["tools"]] == ["echo", "length", "crash"]
    length = server["tools"][1]["input_schema"]
    assert length == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "strict": {"type": "boolean"}},
    }
    signature = "length(*, text: Optional[str] = None, strict: Optional[bool] = None) -> dict"
    assert docs["docs"][0]["signature"] == signature
    assert found["results"][0]["tool"] == "length"
    assert skills.value.kind == "unavailable"


def test_cells_whose_calls_were_cut_are_not_replayable() -> None:
    assert recorded_in_full(FIRST) and recorded_in_full(SECOND)
    assert recorded_in_full(v4.new_code_cell("1"))
    cut = call("My Edge", "echo", {"text": "a"}, result_truncated=True)
    assert not recorded_in_full(cell([cut]))
    no_args = {"server": "My Edge", "tool": "echo", "arguments_truncated": True, "result": text("a")}
    assert not recorded_in_full(cell([no_args]))
