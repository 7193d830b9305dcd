"""Tool schemas as small as possible: every byte of ``tools/list`` costs context in every conversation."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.tools import Tool

from kernelbridge.server.arguments import CheckedTool


def compact_schema(schema: Any) -> Any:
    """Drop what a model does not need from a pydantic JSON schema: titles, and the ``null``
    branch of optional arguments (omitting an argument means the same)."""
    if isinstance(schema, list):
        return [compact_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: compact_schema(v) for k, v in schema.items() if k != "title"}
    branches = out.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches and len(branches) == 2:
        del out["anyOf"]
        out.update(next(b for b in branches if b != {"type": "null"}))
        if out.get("default", 0) is None:
            del out["default"]
    return out


def compact_tool(fn: Any, description: str, structured_output: bool = False) -> Tool:
    """A tool whose published schema is as small as possible: every byte of tools/list is
    context spent in every conversation. Arguments are still validated by the full model, and
    refused in one line (:mod:`kernelbridge.server.arguments`)."""
    tool = CheckedTool.from_function(fn, description=description, structured_output=structured_output)
    tool.parameters = compact_schema(tool.parameters)
    return tool
