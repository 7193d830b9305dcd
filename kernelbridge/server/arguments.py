"""A tool call's arguments checked against its schema before the tool runs, refused in one line.

The MCP SDK validates arguments with pydantic and answers a mismatch with pydantic's report: three
lines per problem, the rejected value echoed (a megabyte of ``code`` sent as a list comes back
whole) and a documentation URL. A model needs none of that: it needs to know which argument is
wrong and what it should be. So :class:`CheckedTool` answers every mismatch with one line
(``run_python needs `code` (a string)``; ``run_python needs `timeout` as an integer, not a
string``), worded from the tool's published schema and the JSON types of what was sent, never the
value itself. An argument the tool does not have is refused too, naming the ones it has: a typo
(``sesion``) would otherwise run the code in the default session. A tool's own refusals
(``timeout must be between 1 and 600 seconds, got -1``) come as they were raised, without the
SDK's ``Error executing tool run_python:`` before them.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import ValidationError

MAX_PROBLEMS = 3
"""Problems named in the line; more are counted."""
_JSON_TYPES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


class CheckedTool(Tool):
    """A tool whose bad arguments are refused in one line (see the module docstring)."""

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        unknown = sorted(set(arguments) - set(self._properties()))
        if unknown:
            raise ToolError(self._unknown(unknown))
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError):
                raise
            if isinstance(cause, ValidationError):  # the SDK's own check of the arguments
                raise ToolError(self._mismatch(cause, arguments)) from None
            if isinstance(cause, ToolError) and not isinstance(cause, UnexpectedToolError):
                # The tool's own refusal, without the SDK's "Error executing tool X: " in front:
                # each of them is one line that says what is wrong, as the ones above.
                raise cause from cause.__cause__
            raise

    def _properties(self) -> dict[str, Any]:
        properties = self.parameters.get("properties")
        return properties if isinstance(properties, dict) else {}

    def _unknown(self, names: list[str]) -> str:
        shown = ", ".join(f"`{_short(name)}`" for name in names[:MAX_PROBLEMS])
        more = f" and {len(names) - MAX_PROBLEMS} more" if len(names) > MAX_PROBLEMS else ""
        takes = ", ".join(self._properties()) or "no arguments"
        plural = "s" * (len(names) > 1)
        return f"{self.name} has no argument{plural} {shown}{more} (it takes: {takes})"

    def _mismatch(self, error: ValidationError, arguments: dict[str, Any]) -> str:
        problems: list[str] = []
        named: set[str] = set()
        for item in error.errors():
            loc = item.get("loc") or ()
            name = str(loc[0]) if loc else ""
            if not name or name in named:
                continue  # one problem per argument (a union reports each of its branches)
            named.add(name)
            expected = describe(self._properties().get(name))
            if item.get("type") == "missing":
                problems.append(f"`{name}` ({expected})")
            else:
                problems.append(f"`{name}` as {expected}, not {json_type(arguments.get(name))}")
        if not problems:
            return f"{self.name} got arguments it cannot use"
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        return f"{self.name} needs " + "; ".join(problems[:MAX_PROBLEMS]) + more


def describe(schema: object) -> str:
    """What a JSON schema admits, in a few words ("a string", "a list of strings")."""
    if not isinstance(schema, dict):
        return "a value"
    branches = schema.get("anyOf")
    if isinstance(branches, list) and branches:
        return " or ".join(dict.fromkeys(describe(branch) for branch in branches))
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return f"a list of {_plural(describe(items))}" if isinstance(items, dict) else "a list"
    if kind == "object":
        values = schema.get("additionalProperties")
        return f"an object of {_plural(describe(values))}" if isinstance(values, dict) else "an object"
    return _JSON_TYPES.get(kind, "a value") if isinstance(kind, str) else "a value"


def json_type(value: object) -> str:
    """The JSON type of a value that came from a client, in the words of :func:`describe`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction" if not value.is_integer() else "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | dict):
        items = list(value.values() if isinstance(value, dict) else value)[:100]
        inner = " and ".join(dict.fromkeys(json_type(item) for item in items))
        kind = "an object" if isinstance(value, dict) else "a list"
        return f"{kind} holding {inner}" if inner else f"an empty {kind.split()[-1]}"
    return type(value).__name__


def _plural(kind: str) -> str:
    noun = kind.removeprefix("an ").removeprefix("a ")
    return noun + "s" if noun != kind else kind


def _short(name: str) -> str:
    return name if len(name) <= 40 else name[:40] + "..."
