"""Tool proxies (real functions), server proxies (``mcp_<alias>``) and server modules, from manifest records.

One function object per tool, shared by the server proxy and the module: ``mcp_time.get_current_time``,
``mcp_servers["time"].get_current_time`` and ``from mcp.servers.time import get_current_time`` are one
thing. A tool proxy ``f``: ``await f(**arguments)`` returns ``{"content", "structuredContent",
"isError"}`` (a tool's own error is ``isError`` true; a failure to call it raises an McpError),
``f.sync(**arguments)`` blocks; ``f.server``, ``f.tool`` (real names) and ``f.input_schema``;
``help(f)`` shows the parameters. A malformed record (from the host, and through it from third-party
servers) is skipped, never an exception that would leave the namespace half updated.
"""

from __future__ import annotations

import inspect
import keyword
import types
from collections.abc import Callable, Coroutine
from typing import Any, cast

from . import _transport
from ._errors import McpError
from ._signature import ToolSignature, tool_signature

MAX_DESCRIPTION_CHARS = 8000
_RESERVED_ATTRIBUTES = frozenset({"list_tools"})

ToolFunction = Callable[..., Coroutine[Any, Any, dict[str, Any]]]


def tool_result(raw: object) -> dict[str, Any]:
    """A ``call_tool`` answer as the plain dict the sandbox API promises."""
    if not isinstance(raw, dict):
        raise McpError("the host sent a malformed tool result")
    content = raw.get("content")
    structured = raw.get("structuredContent")
    return {
        "content": content if isinstance(content, list) else [],
        "structuredContent": structured if isinstance(structured, dict) else None,
        "isError": raw.get("isError") is True,
    }


def call_params(server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"server": server, "tool": tool, "arguments": arguments}


def _valid_alias(value: object, keyword_ok: bool = False) -> bool:
    # The host computes aliases (docs/rpc.md); these checks only keep a buggy one from breaking the
    # proxy class (dunders, the proxy's own _kb_ attributes) or a module name.
    return (
        isinstance(value, str)
        and value.isidentifier()
        and not value.startswith(("__", "_kb_"))
        and (keyword_ok or not keyword.iskeyword(value))
    )


def make_tool_function(server: str, server_alias: str, tool: dict[str, Any]) -> ToolFunction | None:
    """The proxy function for one ``Tool`` record, or None if the record is unusable."""
    name, alias = tool.get("name"), tool.get("alias")
    if not isinstance(name, str) or not _valid_alias(alias):
        return None
    assert isinstance(alias, str)
    schema = tool.get("input_schema")
    description = tool.get("description")
    description = description[:MAX_DESCRIPTION_CHARS] if isinstance(description, str) else ""
    signature = tool_signature(schema)
    proxy_name = f"mcp_{server_alias}.{alias}"

    async def call(arguments: dict[str, Any]) -> dict[str, Any]:
        __tracebackhide__ = True
        return tool_result(await _transport.request_async("call_tool", call_params(server, name, arguments)))

    def tool_proxy(*args: Any, **kwargs: Any) -> Coroutine[Any, Any, dict[str, Any]]:
        __tracebackhide__ = True
        # An async def's call makes a types.CoroutineType, whose names are writable: so that
        # "coroutine ... was never awaited" names the tool that was not awaited.
        coroutine = cast(
            "types.CoroutineType[Any, Any, dict[str, Any]]", call(signature.arguments(alias, args, kwargs))
        )
        coroutine.__name__ = alias
        coroutine.__qualname__ = proxy_name
        return coroutine

    def tool_proxy_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
        __tracebackhide__ = True
        arguments = signature.arguments(f"{alias}.sync", args, kwargs)
        return tool_result(_transport.request("call_tool", call_params(server, name, arguments)))

    doc = tool_doc(server, server_alias, name, alias, description, signature)
    _dress(tool_proxy, alias, alias, server_alias, signature, doc)
    sync_doc = f"Blocking form of {proxy_name}(): same arguments, returns the result dict.\n\n{doc}"
    _dress(tool_proxy_sync, alias, f"{alias}.sync", server_alias, signature, sync_doc)
    attributes: dict[str, Any] = {
        "sync": tool_proxy_sync,
        "server": server,
        "tool": name,
        "input_schema": schema if isinstance(schema, dict) else {},
    }
    tool_proxy.__dict__.update(attributes)
    tool_proxy_sync.__dict__.update({k: v for k, v in attributes.items() if k != "sync"})
    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+: help() then says "async"
    if mark is not None:
        mark(tool_proxy)
    return tool_proxy


def _dress(
    func: Callable[..., Any], name: str, qualname: str, server_alias: str, sig: ToolSignature, doc: str
) -> None:
    func.__name__ = name
    func.__qualname__ = qualname
    func.__module__ = f"mcp.servers.{server_alias}"
    func.__doc__ = doc
    func.__signature__ = sig.signature  # type: ignore[attr-defined]  # inspect and help() read it


def tool_doc(
    server: str, server_alias: str, name: str, alias: str, description: str, sig: ToolSignature
) -> str:
    parts = [description.strip() or f"Tool {name!r} of the host MCP server {server!r}.", sig.doc_section()]
    real = f"  (tool {name!r} of server {server!r})" if name != alias or server != server_alias else ""
    parts.append(
        'Returns {"content", "structuredContent", "isError"}: a tool error sets isError, a failed call'
        f" raises mcp.McpError.\nCall: await mcp_{server_alias}.{alias}({sig.example()}), or"
        f" mcp_{server_alias}.{alias}.sync(...) without await.{real}"
    )
    return "\n\n".join(parts)


class ServerProxy:
    """A host MCP server granted to this session: its tools are attributes (``await mcp_x.tool(...)``).

    Each server gets its own subclass whose tools are static attributes, so ``help(mcp_x)`` lists
    every tool with its signature and ``dir(mcp_x)`` completes them. A tool is also reachable by its
    real name through ``getattr(mcp_x, "real-name")``.
    """

    __slots__ = ()
    _kb_name = ""
    _kb_alias = ""
    _kb_record: dict[str, Any] = {}
    _kb_tools: dict[str, ToolFunction] = {}
    _kb_error = ""
    """Why the host could not list the server's tools when it was granted ("" if it could)."""

    def __getattr__(self, attribute: str) -> ToolFunction:
        if attribute.startswith("_"):
            raise AttributeError(attribute)  # IPython's display probes (_repr_html_, ...) end here
        for function in self._kb_tools.values():
            if getattr(function, "tool", None) == attribute:
                return function
        if self._kb_error:
            # Its tools are unknown, not absent: let the host answer (it restarts the server, or
            # says why it still cannot, instead of a misleading "no tool").
            return unlisted_tool(self._kb_name, self._kb_alias, attribute, self._kb_error)
        tools = ", ".join(self._kb_tools) or "none"
        raise AttributeError(
            f"host MCP server {self._kb_name!r} has no tool {attribute!r} (its tools: {tools});"
            f" runtime.search_tool_docs_sync({attribute!r}) searches every server"
        )

    def __dir__(self) -> list[str]:
        return sorted({*self._kb_tools, "list_tools"})

    def __repr__(self) -> str:
        count = len(self._kb_tools)
        tools = f"{count} tool{'s' * (count != 1)}: {', '.join(self._kb_tools)}"
        if self._kb_error:
            tools = f"tools unknown, the host could not list them ({self._kb_error[:300]})"
        return f"<mcp server {self._kb_name!r} as mcp_{self._kb_alias}: {tools}>"

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools as the host describes them now (``runtime.list_tools(server)``)."""
        __tracebackhide__ = True
        result = await _transport.request_async("list_tools", {"server": self._kb_name})
        return _tool_records(result)


def _tool_records(result: object) -> list[dict[str, Any]]:
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        raise McpError("the host sent a malformed tool list")
    return [t for t in tools if isinstance(t, dict)]


def unlisted_tool(server: str, server_alias: str, tool: str, error: str) -> ToolFunction:
    """A proxy for a tool of a server whose tool list the host could not give (any arguments)."""
    record = {
        "name": tool,
        "alias": tool if _valid_alias(tool) else "unlisted_tool",
        "description": f"A tool of {server!r}, whose tools are unknown: the host could not list"
        f" them when the server was granted ({error[:300]}).",
        "input_schema": {"type": "object", "additionalProperties": True},
    }
    function = make_tool_function(server, server_alias, record)
    assert function is not None  # a valid alias and a string name always make one
    return function


def server_doc(record: dict[str, Any], functions: dict[str, ToolFunction]) -> str:
    name, alias = record["name"], record["alias"]
    description = record.get("description")
    lines = [f"Host MCP server {name!r}, granted to this session as mcp_{alias}."]
    if isinstance(description, str) and description.strip():
        lines += ["", " ".join(description.split())[:MAX_DESCRIPTION_CHARS]]
    error = record.get("error")
    if isinstance(error, str) and error:
        lines += [
            "",
            f"The host could not list its tools when it was granted: {error[:300]}",
            f"Calling mcp_{alias}.<tool>(...) asks the host again.",
        ]
    lines += ["", f"Tools (await mcp_{alias}.<tool>(...), or <tool>.sync(...) in plain code):"]
    for alias_, function in functions.items():
        first = (function.__doc__ or "").strip().splitlines()[0:1]
        lines.append(f"  {alias_}{inspect.signature(function)}")
        if first:
            lines.append(f"      {first[0][:200]}")
    lines += ["", f"help(mcp_{alias}.<tool>) shows one tool's parameters."]
    return "\n".join(lines)


def build_server(record: dict[str, Any]) -> tuple[ServerProxy, types.ModuleType] | None:
    """The proxy and the ``mcp.servers.<alias>`` module for one ``Server`` record (None if unusable)."""
    name, alias = record.get("name"), record.get("alias")
    # `mcp_import` is a fine name even if `mcp.servers.import` cannot be written in an import statement.
    if not isinstance(name, str) or not _valid_alias(alias, keyword_ok=True):
        return None
    assert isinstance(alias, str)
    functions: dict[str, ToolFunction] = {}
    tools = record.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        try:
            function = make_tool_function(name, alias, tool)
        except Exception:  # one strange tool must not cost the whole server
            function = None
        if function is not None and function.__name__ not in functions:
            functions[function.__name__] = function
    record = {**record, "tools": [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []}
    error = record.get("error")
    error = " ".join(error.split())[:1000] if isinstance(error, str) and not functions else ""
    doc = server_doc(record, functions)
    namespace: dict[str, Any] = {
        "__doc__": doc,
        "__module__": f"mcp.servers.{alias}",
        "__slots__": (),
        "_kb_name": name,
        "_kb_alias": alias,
        "_kb_record": record,
        "_kb_tools": functions,
        "_kb_error": error,
    }
    namespace.update({a: staticmethod(f) for a, f in functions.items() if a not in _RESERVED_ATTRIBUTES})
    proxy_class = type(f"mcp_{alias}", (ServerProxy,), namespace)
    proxy = proxy_class()

    module = types.ModuleType(f"mcp.servers.{alias}", doc)
    module.__dict__.update(functions)
    module.__dict__.update(
        {
            "__all__": list(functions),
            "SERVER": name,
            "TOOLS": record["tools"],
            "TOOL_MAP": {t.get("alias"): t for t in record["tools"] if isinstance(t.get("alias"), str)},
        }
    )
    if error:

        def module_getattr(attribute: str) -> ToolFunction:
            # PEP 562: `from mcp.servers.<alias> import <tool>` of a server whose tools are unknown
            if attribute.startswith("_"):
                raise AttributeError(f"module {module.__name__!r} has no attribute {attribute!r}")
            return unlisted_tool(name, alias, attribute, error)

        module.__dict__["__getattr__"] = module_getattr
    return proxy, module
