"""kernelbridge.hub: the user's host MCP servers, for code running in sandboxes.

General layout (each module depends only on those above it)::

    jsonread.py    bounded JSON reading: small files, VS Code's JSONC, values picked from a big file
    sources.py     where server definitions are found (MCP clients' files, ~/MCPs, ...), in precedence order
    config.py      those files -> ServerCatalog (+ one line of problems per file); self-launch detection
    aliases.py     Python names for servers and tools
    policy.py      operator allow/deny of servers and tools (from Settings)
    signatures.py  proxy signature strings, by the kernel's own rules (inside/pythonpath/mcp/_signature.py)
    docs.py        ServerSummary/Server/Tool/ToolDoc records and ranked search
    skills.py      the saved-tools stores, one per namespace (<ns state dir>/skills; also the CLI's API)
    streams.py     a server's stderr as a bounded log; a transport whose end is observed
    clients.py     ServerClient: one warm MCP client per server, restart, tool cache; ClientPool: one
                   per configured server, their task group, bounded close
    dispatch.py    Hub: owns the pool, applies grants and policy, answers every rpc method

The call seam it answers (RpcCall, RpcHandler) is :mod:`kernelbridge.calls`; the wire contract
docs/rpc.md. Typical use by the session layer::

    async with Hub(settings) as hub:
        grants = frozenset(hub.validate_grants(servers))        # HubError -> ToolError
        try:
            call = RpcCall(session, grants, frame["method"], frame["params"], namespace=namespace)
            result = await hub.dispatch(call)
        except RpcError as exc:
            error = exc.to_wire()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.errors import HubError, RpcError, ServerFailure, SkillError
from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.calls import RpcCall, RpcHandler
    from kernelbridge.calls.wire import KINDS, METHODS
    from kernelbridge.hub.aliases import alias, assign_aliases
    from kernelbridge.hub.clients import ClientState, ServerClient
    from kernelbridge.hub.config import (
        HttpServer,
        ServerCatalog,
        ServerConfig,
        Shadowed,
        StdioServer,
        config_files,
        launches_kernelbridge,
        load_catalog,
    )
    from kernelbridge.hub.dispatch import Hub, tool_result
    from kernelbridge.hub.policy import Policy
    from kernelbridge.hub.signatures import python_signature
    from kernelbridge.hub.skills import Skill, SkillInfo, list_skills, read_skill, remove_skill, save_skill
    from kernelbridge.hub.sources import ConfigSource, config_sources

__all__ = [
    "KINDS",
    "METHODS",
    "ClientState",
    "ConfigSource",
    "HttpServer",
    "Hub",
    "HubError",
    "Policy",
    "RpcCall",
    "RpcError",
    "RpcHandler",
    "ServerCatalog",
    "ServerClient",
    "ServerConfig",
    "ServerFailure",
    "Shadowed",
    "Skill",
    "SkillError",
    "SkillInfo",
    "StdioServer",
    "alias",
    "assign_aliases",
    "config_files",
    "config_sources",
    "launches_kernelbridge",
    "list_skills",
    "load_catalog",
    "python_signature",
    "read_skill",
    "remove_skill",
    "save_skill",
    "tool_result",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
