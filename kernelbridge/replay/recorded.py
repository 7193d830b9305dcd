"""Host tool calls answered from a notebook's recording (``kernelbridge.tool_calls``): offline replay.

:class:`RecordedTools` answers ``call_tool`` with the first unused recorded call *of the current
cell* (:meth:`RecordedTools.begin`) with the same server, tool and arguments; a call the recording
lacks fails with ``server_error``: the replay never guesses. The docs methods describe the recorded
servers and tools (input schemas inferred from the arguments, every parameter optional); skills
answer ``unavailable``. The runner skips cells whose calls were not recorded in full
(:func:`recorded_in_full`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import mcp_types as types

from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.calls.wire import KINDS, check_result_size, parse_request
from kernelbridge.errors import HubError, RpcError
from kernelbridge.hub import docs
from kernelbridge.hub.aliases import assign_aliases, resolve
from kernelbridge.session.broker import MAX_CALLS_PER_CELL

DESCRIPTION = "Recorded by kernelbridge: answered from the notebook's recording, not a live server."
_JSON_TYPES: dict[type, str] = {str: "string", bool: "boolean", int: "integer", float: "number",
                                list: "array", dict: "object", type(None): "null"}  # fmt: skip


def cell_meta(cell: Any) -> dict[str, Any]:
    meta = (cell.get("metadata") or {}).get("kernelbridge")
    return meta if isinstance(meta, dict) else {}


def tool_calls(cell: Any) -> list[dict[str, Any]]:
    calls = cell_meta(cell).get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def recorded_in_full(cell: Any, live: Iterable[str] = ()) -> bool:
    """Every tool call of ``cell`` has its arguments and its result (or error) recorded; calls to
    the servers in ``live`` (answered by live servers) need not be."""
    calls = [c for c in tool_calls(cell) if c.get("server") not in set(live)]
    if len(tool_calls(cell)) >= MAX_CALLS_PER_CELL:
        return False  # the broker stops recording there: later calls are unknown
    return all(
        isinstance(c.get("server"), str)
        and isinstance(c.get("tool"), str)
        and isinstance(c.get("arguments"), dict)
        and ("result" in c or c.get("error"))
        and not c.get("arguments_truncated")
        and not c.get("result_truncated")
        for c in calls
    )


class RecordedTools(RpcHandler):
    """Answers rpc requests from the tool calls recorded in a notebook's cells."""

    def __init__(self, cells: Iterable[Any]) -> None:
        servers: list[str] = []
        tools: dict[str, dict[str, dict[str, set[str]]]] = {}
        for cell in cells:
            for name in cell_meta(cell).get("servers") or []:
                if isinstance(name, str) and name not in servers:
                    servers.append(name)
            for call in tool_calls(cell):
                server, tool = call.get("server"), call.get("tool")
                if not isinstance(server, str) or not isinstance(tool, str):
                    continue
                if server not in servers:
                    servers.append(server)
                params = tools.setdefault(server, {}).setdefault(tool, {})
                arguments = call.get("arguments")
                for key, value in (arguments if isinstance(arguments, dict) else {}).items():
                    params.setdefault(str(key), set()).add(_JSON_TYPES.get(type(value), "object"))
        self._aliases = assign_aliases(servers)
        self._tools = tools
        self._current: list[dict[str, Any]] = []

    @property
    def servers(self) -> list[str]:
        return list(self._aliases)

    def validate_grants(self, names: list[str]) -> list[str]:
        """``check_grants`` of the session layer: only servers the recording knows."""
        canonical: list[str] = []
        for name in names:
            given: object = name  # from the notebook's metadata: checked whatever the annotation says
            real = resolve(name, self._aliases) if isinstance(given, str) else None
            if real is None:
                known = ", ".join(self._aliases) or "none"
                raise HubError(
                    f"server {str(name)[:100]!r} is not in the recording (recorded: {known}); "
                    f"`kernelbridge replay --grant {str(name)[:100]}` calls a configured server live"
                )
            if real not in canonical:
                canonical.append(real)
        return canonical

    def begin(self, cell: Any) -> None:
        """The cell about to run: its recorded calls are the ones ``call_tool`` may answer."""
        self._current = list(tool_calls(cell))

    async def dispatch(self, call: RpcCall) -> object:
        method, params = parse_request(call.method, call.params)
        if method == "call_tool":
            result = self._call_tool(call, params)
        elif method in ("save_tool", "list_skills", "load_skill"):
            raise RpcError("unavailable", "saved tools are not part of a recording")
        else:
            result = self._docs(call, method, params)
        check_result_size(result)
        return result

    # -- call_tool ------------------------------------------------------------------------------
    def _call_tool(self, call: RpcCall, params: dict[str, Any]) -> object:
        server = self._server(params["server"], call)
        tool = self._tool(server, params["tool"])
        wanted = _canonical_json(params["arguments"])
        for n, record in enumerate(self._current):
            if (
                resolve(str(record.get("server")), self._aliases) == server
                and record.get("tool") == tool
                and _canonical_json(record.get("arguments")) == wanted
            ):
                del self._current[n]
                error = record.get("error")
                if error:
                    kind, _, message = str(error).partition(": ")
                    raise RpcError(kind if kind in KINDS else "server_error", message or str(error))
                return record.get("result")
        raise RpcError(
            "server_error",
            f"no recorded call of {server}.{tool} with these arguments in this cell: a replay with "
            "--recorded-tools answers only the calls the notebook recorded",
        )

    # -- servers, tools and docs ------------------------------------------------------------------
    def _server(self, name: str, call: RpcCall | None = None) -> str:
        real = resolve(name, self._aliases)
        if real is None or (call is not None and real not in call.grants):
            raise RpcError("not_available", f"Server '{name}' is not available")
        return real

    def _tool(self, server: str, name: str) -> str:
        tools = self._tools.get(server, {})
        real = resolve(name, assign_aliases(tools))
        if real is None:
            raise RpcError("unknown_tool", f"Server '{server}' has no tool '{name}'")
        return real

    def _entries(self, server: str) -> list[docs.ToolEntry]:
        tools = self._tools.get(server, {})
        aliases = assign_aliases(tools)
        entries = []
        for name, params in tools.items():
            properties = {
                key: ({"type": next(iter(kinds))} if len(kinds) == 1 else {}) for key, kinds in params.items()
            }
            schema = {"type": "object", "properties": properties}
            tool = types.Tool(name=name, description=DESCRIPTION, input_schema=schema)
            entries.append(docs.ToolEntry(server, self._aliases[server], tool, aliases[name]))
        return entries

    def _summary(self, server: str, call: RpcCall) -> dict[str, Any]:
        return {
            "name": server,
            "alias": self._aliases[server],
            "description": DESCRIPTION,
            "granted": server in call.grants,
            "transport": "stdio",
        }

    def _record(self, server: str, call: RpcCall) -> dict[str, Any]:
        return {**self._summary(server, call), "tools": [docs.tool_record(e) for e in self._entries(server)]}

    def _docs(self, call: RpcCall, method: str, params: dict[str, Any]) -> object:
        granted = [s for s in self._aliases if s in call.grants]
        if method == "manifest":
            return {"servers": [self._record(s, call) for s in granted]}
        if method == "list_servers":
            return {"servers": granted}
        if method == "discovered_servers":
            make = self._record if params["detailed"] else self._summary
            return {"servers": [make(s, call) for s in self._aliases]}
        if method == "describe_server":
            return self._record(self._server(params["server"]), call)
        if method == "list_tools":
            return {"tools": [docs.tool_record(e) for e in self._entries(self._server(params["server"]))]}
        if method == "query_tool_docs":
            server = self._server(params["server"])
            entries = self._entries(server)
            if params["tool"] is not None:
                real = self._tool(server, params["tool"])
                entries = [e for e in entries if e.tool.name == real]
            return {"docs": [docs.tool_doc(e, params["detail"]) for e in entries]}
        if method == "search_tool_docs":
            entries = [e for s in self._aliases for e in self._entries(s)]
            hits = docs.search(params["query"], entries, params["limit"])
            return {"results": [{**docs.tool_doc(e), "score": score} for score, e in hits]}
        raise RpcError("invalid_params", f"unknown method {method!r}")  # pragma: no cover


def _canonical_json(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(value)
