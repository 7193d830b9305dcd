"""kernelbridge.hub: the user's host MCP servers, for code running in sandboxes.

The session layer calls it through the seam of :mod:`kernelbridge.calls` (wire contract: docs/rpc.md)::

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
