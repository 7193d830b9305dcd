"""The sandbox's ``mcp`` package: call the user's host MCP servers from code in a kernelbridge kernel.

This is not the MCP SDK. It runs inside the sandbox kernel, where it is the top-level ``mcp``, and
reaches the host only through kernelbridge's rpc channel (docs/rpc.md). Every call is checked on the
host against the session's grants and the operator's policy.

Layout:

- ``runtime``      public helpers: call_tool, list_tools, query/search docs, discovered_servers, ...
- ``servers``      ``mcp.servers.<alias>`` modules of the granted servers (made by refresh)
- ``skills``       ``from mcp.skills import <name>`` loads a saved tool
- ``_transport``   the rpc channel: socket from KERNELBRIDGE_RPC_FD, reader thread, futures
- ``_signature``   Python signatures from tool input schemas
- ``_proxies``     tool functions, ``mcp_<alias>`` proxies, server modules
- ``_registry``    the granted servers; binds them into the namespace on refresh
- ``_skills``      save_tool, skill loading
- ``_ipython``     the IPython extension that binds the API into a kernel's namespace
- ``_errors``      McpError and its subclasses, one per rpc error kind
- ``_tracebacks``  what the kernel's shell shows of an exception: the user's line, not the package's frames
- ``_packages``    ``%pip install`` through the host: fetch wheels over rpc, install them with installer

The host calls :func:`_kernelbridge_refresh` (``import mcp; mcp._kernelbridge_refresh()``, a silent
execute request) whenever the session's grants change or the kernel restarted.
"""

from __future__ import annotations

import sys
from typing import Any

from . import runtime, servers, skills
from ._errors import (
    McpBusy,
    McpCancelled,
    McpError,
    McpInvalidParams,
    McpServerError,
    McpServerNotAvailable,
    McpTooLarge,
    McpToolDenied,
    McpUnavailable,
    McpUnknownTool,
    PackageError,
)
from ._registry import REGISTRY, ServerModuleFinder, install_finder, refresh
from ._skills import SkillFinder, save_tool

__all__ = [
    "McpBusy",
    "McpCancelled",
    "McpError",
    "McpInvalidParams",
    "McpServerError",
    "McpServerNotAvailable",
    "McpTooLarge",
    "McpToolDenied",
    "McpUnavailable",
    "McpUnknownTool",
    "PackageError",
    "runtime",
    "save_tool",
    "servers",
    "skills",
]

mcp_servers = REGISTRY.servers
"""The granted servers' proxies by name (the object bound as ``mcp_servers`` in the namespace)."""


def _kernelbridge_refresh() -> dict[str, Any]:
    """Called by the host (silent execute) after a grant change or a kernel restart: fetch the
    session's manifest and rebind ``mcp_<alias>``, ``mcp_servers`` and ``mcp.servers.<alias>``.

    Idempotent; removes what is no longer granted. Returns ``{"servers": [...], "removed": [...],
    "skipped": [...]}`` (aliases). Raises McpUnavailable without a host (the execute reply then
    has status "error" and ename "McpUnavailable").
    """
    __tracebackhide__ = True
    return refresh()


install_finder(SkillFinder(sys.modules[__name__]))
install_finder(ServerModuleFinder())
