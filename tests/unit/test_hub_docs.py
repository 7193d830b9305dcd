"""Docs records, Python signature strings and ranked search."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from kernelbridge.hub import python_signature
from kernelbridge.hub.config import HttpServer, StdioServer
from kernelbridge.hub.docs import ToolEntry, search, server_summary, tool_doc, tool_record, words


def schema(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or []}


@pytest.mark.parametrize(
    ("input_schema", "expected"),
    [
        (schema(["timezone"], timezone={"type": "string"}), "f(*, timezone: str) -> dict"),
        ({}, "f() -> dict"),
        ({"type": "object"}, "f() -> dict"),
        (
            schema(["a"], a={"type": "integer"}, b={"type": "number", "default": 1.5}, c={"type": "boolean"}),
            "f(*, a: int, b: float = 1.5, c: Optional[bool] = None) -> dict",
        ),
        (schema(["x"], x={"type": ["string", "null"]}), "f(*, x: Optional[str]) -> dict"),
        (
            schema(["x"], x={"anyOf": [{"type": "integer"}, {"type": "string"}]}),
            "f(*, x: Union[int, str]) -> dict",
        ),
        (schema(["x"], x={"enum": ["a", "b"]}), "f(*, x: Literal['a', 'b']) -> dict"),
        (schema(["x"], x={"const": 3}), "f(*, x: Literal[3]) -> dict"),
        (
            schema(["x"], x={"type": "array", "items": {"type": ["string", "null"]}}),
            "f(*, x: list) -> dict",
        ),
        (schema(["x"], x={"type": "object"}), "f(*, x: dict) -> dict"),
        (schema(["x"], x={"$ref": "#/$defs/T"}), "f(*, x: Any) -> dict"),
        (schema(["x"], x={}), "f(*, x: Any) -> dict"),
        (schema(["x", "y"], x={"type": "string"}), "f(*, x: str) -> dict"),
        (
            schema(["from"], **{"from": {"type": "string"}, "q": {"type": "string"}}),
            "f(*, from_: str, q: Optional[str] = None) -> dict",
        ),
        (schema(**{"max-results": {"type": "integer"}}), "f(*, max_results: Optional[int] = None) -> dict"),
        (schema(x={"type": "string", "default": "yz"}), "f(*, x: str = 'yz') -> dict"),
        (schema(x={"type": "boolean", "default": True}), "f(*, x: bool = True) -> dict"),
        (schema(x={"type": "string", "default": None}), "f(*, x: Optional[str] = None) -> dict"),
    ],
)
def test_signature(input_schema: dict[str, Any], expected: str) -> None:
    # The kernel's own rules (sandbox/pythonpath/mcp/_signature.py): docs show what proxies have.
    assert python_signature("f", input_schema) == expected


def test_signature_depth_is_bounded() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(10):
        deep = {"type": "array", "items": deep}
    assert python_signature("f", schema(["x"], x=deep)) == "f(*, x: list) -> dict"


def entry(server: str, name: str, description: str = "", **properties: Any) -> ToolEntry:
    tool = types.Tool(name=name, description=description, input_schema=schema(**properties))
    return ToolEntry(server, server.replace("-", "_"), tool, name.replace("-", "_"))


def test_words() -> None:
    assert words("getCurrentTime") == ["get", "current", "time"]
    assert words("get_current-time") == ["get", "current", "time"]
    assert words("HTTPServer v2") == ["http", "server", "v", "2"]


def test_exact_tool_name_beats_a_description_mention() -> None:
    entries = [
        entry("a", "echo_all", "Repeat every message"),
        entry("a", "shout", "Like echo, but louder"),
        entry("b", "echo", "Return the input"),
    ]
    ranked = [e.tool.name for _, e in search("echo", entries, 10)]
    assert ranked == ["echo", "echo_all", "shout"]


def test_ranking_uses_fields_and_drops_non_matches() -> None:
    entries = [
        entry("weather", "forecast", "Weather forecast for a city", city={"type": "string"}),
        entry(
            "time", "get_current_time", "Get current time in a specific timezone", timezone={"type": "string"}
        ),
        entry("time", "convert_time", "Convert time between timezones", source_timezone={"type": "string"}),
        entry("files", "read_file", "Read a file"),
    ]
    hits = search("convert time", entries, 5)
    assert [e.tool.name for _, e in hits] == ["convert_time", "get_current_time"]
    assert hits[0][0] > hits[1][0] > 0
    # A parameter name counts: "city" is only a parameter of forecast.
    assert [e.tool.name for _, e in search("city", entries, 5)] == ["forecast"]
    # A server name counts too.
    assert {e.tool.name for _, e in search("weather", entries, 5)} == {"forecast"}
    assert search("zebra", entries, 5) == []


def test_prefix_and_typo_matches() -> None:
    entries = [entry("t", "convert_time", "Convert between zones"), entry("t", "list_files", "List files")]
    assert search("conv", entries, 5)[0][1].tool.name == "convert_time"
    assert search("convrt", entries, 5)[0][1].tool.name == "convert_time"


def test_limit_and_tie_order() -> None:
    entries = [entry("s1", "echo"), entry("s2", "echo"), entry("s3", "echo")]
    assert [e.server for _, e in search("echo", entries, 2)] == ["s1", "s2"]


def test_records_never_carry_secrets() -> None:
    stdio = StdioServer("s", "/secret/bin", ("--token", "t0ken"), {"KEY": "v4lue"}, description="d")
    http = HttpServer("h", "https://u:p@host/mcp?k=k3y", {"Authorization": "Bearer b34rer"})
    for config in (stdio, http):
        record = server_summary(config.name, config.name, config, granted=True)
        assert set(record) == {"name", "alias", "description", "granted", "transport"}
        assert not any(s in repr(record) for s in ("secret", "t0ken", "v4lue", "k3y", "b34rer"))


def test_tool_records() -> None:
    e = entry("time", "get_current_time", "Get current time.\nMore detail here.", timezone={"type": "string"})
    assert tool_record(e) == {
        "name": "get_current_time",
        "alias": "get_current_time",
        "description": "Get current time.\nMore detail here.",
        "input_schema": schema(timezone={"type": "string"}),
    }
    summary = tool_doc(e)
    assert summary == {
        "server": "time",
        "server_alias": "time",
        "tool": "get_current_time",
        "alias": "get_current_time",
        "description": "Get current time.",
    }
    full = tool_doc(e, "full")
    assert full["description"] == "Get current time.\nMore detail here."
    assert full["signature"] == "get_current_time(*, timezone: Optional[str] = None) -> dict"
    assert full["output_schema"] is None and full["input_schema"] == e.tool.input_schema
