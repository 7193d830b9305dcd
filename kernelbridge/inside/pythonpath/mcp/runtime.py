"""Helpers for discovering and calling the host's MCP servers from sandboxed code (``runtime``).

Bound in the namespace as ``runtime`` (also ``mcp.runtime``). Async functions need ``await`` (top-level
await works in a cell); each has a blocking ``*_sync`` twin::

    result = await runtime.call_tool("time", "get_current_time", {"timezone": "UTC"})
    hits = runtime.search_tool_docs_sync("convert time")  # tools of every server the host offers

Also: discovered_servers, describe_server, capability_summary (a short manual), save_tool, list_skills,
pip_install. Server and tool arguments accept the real name or the alias; a call needs the server
granted (``run_python(servers=[...])``). Failures raise ``mcp.McpError`` subclasses (alias ``MCPError``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from . import _packages, _transport
from ._errors import McpError
from ._proxies import call_params, tool_result
from ._registry import REGISTRY
from ._skills import list_skills, save_tool

__all__ = [
    "MCPError",
    "McpError",
    "call_tool",
    "call_tool_sync",
    "capability_summary",
    "describe_server",
    "discovered_servers",
    "list_loaded_server_metadata",
    "list_servers",
    "list_servers_sync",
    "list_skills",
    "list_tools",
    "list_tools_sync",
    "pip_install",
    "query_tool_docs",
    "query_tool_docs_sync",
    "save_tool",
    "search_tool_docs",
    "search_tool_docs_sync",
]

MCPError = McpError
Detail = Literal["summary", "full"]
MAX_SEARCH_LIMIT = 50


# -- argument checks (the host checks again; these give a Python error at the right line) -------------
def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty string (a name or an alias), not {value!r}")
    return value


def _detail(value: object) -> Detail:
    if value == "summary" or value == "full":
        return value
    raise ValueError(f'detail must be "summary" or "full", not {value!r}')


def _arguments(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"arguments must be a dict of the tool's parameters, not {type(value).__name__}")
    return value


def _limit(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SEARCH_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_SEARCH_LIMIT}, not {value!r}")
    return value


def _field(result: object, key: str, kind: type) -> Any:
    value = result.get(key) if isinstance(result, dict) else None
    if not isinstance(value, kind):
        raise McpError(f"the host sent a malformed answer (no {key!r})")
    return value


def _dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [item for item in items if isinstance(item, dict)]


def _docs(result: object, tool: str | None) -> list[dict[str, Any]] | dict[str, Any]:
    docs = _dicts(_field(result, "docs", list))
    return docs[0] if tool is not None and len(docs) == 1 else docs


def _hit_key(hit: dict[str, Any]) -> tuple[str, str] | None:
    server, tool = hit.get("server"), hit.get("tool")
    return (server, tool) if isinstance(server, str) and isinstance(tool, str) and server and tool else None


def _with_full_docs(hits: list[dict[str, Any]], fulls: list[Any]) -> list[dict[str, Any]]:
    """Each search hit (with a server and tool) merged with its full docs, in order."""
    merged, rest = [], iter(fulls)
    for hit in hits:
        full = next(rest) if _hit_key(hit) else None
        merged.append({**hit, **full} if isinstance(full, dict) else hit)
    return merged


# -- async ---------------------------------------------------------------------------------------------
async def call_tool(server: str, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call ``tool`` of the granted ``server``; returns ``{"content", "structuredContent", "isError"}``."""
    __tracebackhide__ = True
    params = call_params(_name(server, "server"), _name(tool, "tool"), _arguments(arguments))
    return tool_result(await _transport.request_async("call_tool", params))


async def list_tools(server: str) -> list[dict[str, Any]]:
    """The tools of ``server``: ``[{"name", "alias", "description", "input_schema"}]``."""
    __tracebackhide__ = True
    result = await _transport.request_async("list_tools", {"server": _name(server, "server")})
    return _dicts(_field(result, "tools", list))


async def list_servers() -> tuple[str, ...]:
    """The names of the servers granted to this session, asked of the host."""
    __tracebackhide__ = True
    result = await _transport.request_async("list_servers", {})
    return tuple(n for n in _field(result, "servers", list) if isinstance(n, str))


async def query_tool_docs(
    server: str, tool: str | None = None, detail: Detail = "summary"
) -> list[dict[str, Any]] | dict[str, Any]:
    """Docs of every tool of ``server``, or of one ``tool`` (then a single dict).

    ``detail="full"`` adds ``input_schema``, ``output_schema`` and the proxy's ``signature``.
    """
    __tracebackhide__ = True
    params = {"server": _name(server, "server"), "tool": tool, "detail": _detail(detail)}
    if tool is not None:
        _name(tool, "tool")
    return _docs(await _transport.request_async("query_tool_docs", params), tool)


async def search_tool_docs(query: str, limit: int = 5, detail: Detail = "summary") -> list[dict[str, Any]]:
    """Tools of every offered server matching ``query``, best first (``score``: higher is better).

    ``detail="full"`` adds each hit's full docs (one more host call per hit).
    """
    __tracebackhide__ = True
    params = {"query": _name(query, "query"), "limit": _limit(limit)}
    hits = _dicts(_field(await _transport.request_async("search_tool_docs", params), "results", list))
    if _detail(detail) == "full":
        keys = [key for key in map(_hit_key, hits) if key]
        fulls = await asyncio.gather(*(query_tool_docs(server, tool, "full") for server, tool in keys))
        return _with_full_docs(hits, fulls)
    return hits


# -- sync ----------------------------------------------------------------------------------------------
def call_tool_sync(server: str, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Blocking :func:`call_tool`."""
    __tracebackhide__ = True
    params = call_params(_name(server, "server"), _name(tool, "tool"), _arguments(arguments))
    return tool_result(_transport.request("call_tool", params))


def list_tools_sync(server: str) -> tuple[dict[str, Any], ...]:
    """Blocking :func:`list_tools` (a tuple, as the predecessor returned)."""
    __tracebackhide__ = True
    result = _transport.request("list_tools", {"server": _name(server, "server")})
    return tuple(_dicts(_field(result, "tools", list)))


def query_tool_docs_sync(
    server: str, tool: str | None = None, detail: Detail = "summary"
) -> list[dict[str, Any]] | dict[str, Any]:
    """Blocking :func:`query_tool_docs`."""
    __tracebackhide__ = True
    params = {"server": _name(server, "server"), "tool": tool, "detail": _detail(detail)}
    if tool is not None:
        _name(tool, "tool")
    return _docs(_transport.request("query_tool_docs", params), tool)


def search_tool_docs_sync(query: str, limit: int = 5, detail: Detail = "summary") -> list[dict[str, Any]]:
    """Blocking :func:`search_tool_docs`."""
    __tracebackhide__ = True
    params = {"query": _name(query, "query"), "limit": _limit(limit)}
    hits = _dicts(_field(_transport.request("search_tool_docs", params), "results", list))
    if _detail(detail) == "full":
        return _with_full_docs(
            hits, [query_tool_docs_sync(*key, "full") for key in map(_hit_key, hits) if key]
        )
    return hits


def discovered_servers(detailed: bool = False) -> tuple[str, ...] | tuple[dict[str, Any], ...]:
    """Every server the host offers (granted or not): names, or ``ServerSummary`` dicts if ``detailed``

    (``{"name", "alias", "description", "granted", "transport"}``).
    """
    __tracebackhide__ = True
    result = _transport.request("discovered_servers", {"detailed": bool(detailed)})
    servers = _dicts(_field(result, "servers", list))
    if detailed:
        return tuple(servers)
    return tuple(s["name"] for s in servers if isinstance(s.get("name"), str))


def describe_server(name: str) -> dict[str, Any]:
    """One server with its tools: ``{"name", "alias", "description", "granted", "transport", "tools"}``."""
    __tracebackhide__ = True
    result = _transport.request("describe_server", {"server": _name(name, "name")})
    if not isinstance(result, dict):
        raise McpError("the host sent a malformed server description")
    return result


def list_servers_sync() -> tuple[str, ...]:
    """The granted servers bound in this kernel (as of the last refresh; no host round trip)."""
    return tuple(REGISTRY.servers)


def list_loaded_server_metadata() -> tuple[dict[str, Any], ...]:
    """The granted servers' records with their tools, as bound in this kernel (no host round trip)."""
    return tuple(REGISTRY.records)


def pip_install(*requirements: str, upgrade: bool = False) -> dict[str, Any]:
    """Install packages through the host, as ``%pip install`` does: binary wheels the host's pip
    resolves for this sandbox (no network here), importable at once. Returns ``{"installed":
    [{name, version, ...}], "satisfied": ["name version", ...]}``. Raises mcp.PackageError (no such
    package, no wheel, a conflict, the index down), McpToolDenied (the host's policy) or
    McpTooLarge (the session's cap), each with one line; nothing is installed half-way."""
    __tracebackhide__ = True
    report = _packages.install([str(item) for item in requirements], upgrade=upgrade)
    return {"installed": report.installed, "satisfied": report.satisfied}


def capability_summary() -> str:
    """A short manual of this sandbox for a model: what is granted, how to call it, how to learn more."""
    lines = [
        "Persistent sandboxed Python (IPython kernel): variables, imports and files in /workspace survive"
        " between run_python calls; no network.",
    ]
    try:
        _transport.connect()
    except McpError:
        lines.append("No host MCP servers in this kernel (it was not started by kernelbridge).")
        return "\n".join(lines)
    if REGISTRY.servers:
        described = []
        for name, proxy in REGISTRY.servers.items():
            tools = list(proxy._kb_tools)
            shown = ", ".join(tools[:8]) + (", ..." if len(tools) > 8 else "")
            if proxy._kb_error:
                shown = f"tools unknown: {proxy._kb_error[:200]}"
            described.append(f"mcp_{proxy._kb_alias} ({name!r}: {shown})")
        lines.append("Host MCP servers granted to this session: " + "; ".join(described) + ".")
        lines.append(
            "Call: await mcp_<alias>.<tool>(arg=...) (keyword arguments; top-level await works), or"
            " mcp_<alias>.<tool>.sync(arg=...) in plain code; also mcp_servers['name'],"
            " from mcp.servers.<alias> import <tool>, await runtime.call_tool(server, tool, {...})."
            ' Results are dicts {"content", "structuredContent", "isError"}.'
        )
        lines.append("Learn a tool: help(mcp_<alias>.<tool>) shows its signature and docs.")
    else:
        lines.append("No host MCP server is granted to this session yet.")
    lines += [
        "Find tools: runtime.discovered_servers(detailed=True) lists every server (grant one with"
        " run_python(servers=[...])); runtime.search_tool_docs_sync('words');"
        " runtime.query_tool_docs_sync(server, tool, detail='full'). Async forms without _sync.",
        "Saved tools: save_tool(func) keeps a function for later sessions; from mcp.skills import <name>"
        " loads one; runtime.list_skills().",
        "Packages: %pip install NAME (wheels through the host; importable at once), %pip list.",
        "Errors raise mcp.McpError subclasses (McpServerNotAvailable, McpToolDenied, McpInvalidParams, ...);"
        " a tool's own error is returned with isError true.",
    ]
    return "\n".join(lines)
