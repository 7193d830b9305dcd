"""What an exception of the sandbox API shows: the user's line and the reason, not the package's insides.

The kernel's shell passes every exception it shows through :func:`shown` (docs/rpc.md, "What a
traceback shows"): the innermost run of kernelbridge's own sandbox frames (and the import machinery
between them) is left out, so the last frame is the user's failing call; the exception keeps its
whole ``__traceback__``. A ``NameError`` of a sandbox API name (``mcp_<alias>``, ``mcp_servers``,
``runtime``, ``save_tool``, ``mcp``) in a kernel no host serves becomes ``McpUnavailable`` with the
host's reason; with a host, it stays a NameError saying how to grant the server. Why here:
docs/design/sandbox.md.
"""

from __future__ import annotations

import importlib
import os
import types
from typing import Any

from . import _transport
from ._errors import McpUnavailable
from ._registry import GRANT_HINT, REGISTRY

API_NAMES = frozenset({"mcp", "mcp_servers", "runtime", "save_tool"})
"""What the kernel's extension binds; with ``mcp_<alias>``, the names a NameError is checked for."""
OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
"""``kernelbridge/inside/``: this package (``pythonpath/mcp``) and the kernel's extensions."""
IMPORT_MACHINERY = ("<frozen importlib.", str(importlib.__file__))

ExcInfo = tuple[type[BaseException], BaseException, types.TracebackType | None]


def shown(etype: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> ExcInfo:
    """The exception as IPython should show it (see the module docstring); ``value`` itself when
    there is nothing to change. Asks the host at most once, for a NameError of an API name."""
    if type(value) is NameError:
        replacement = unbound_api_name(value)
        if replacement is not None:
            return type(replacement), replacement, tb
    return etype, value, without_own_frames(tb)


def unbound_api_name(error: NameError) -> BaseException | None:
    """What a NameError of a sandbox API name means here (None: it is not one, keep it)."""
    name = getattr(error, "name", None)
    if not isinstance(name, str) or not (name in API_NAMES or name.startswith("mcp_")):
        return None
    reason = _transport.unavailable()
    if reason is not None:
        replacement: BaseException = McpUnavailable(f"{reason} (so {name} is not defined)")
    elif name.startswith("mcp_") and name != "mcp_servers":
        granted = ", ".join(REGISTRY.aliases()) or "none"
        replacement = NameError(
            f"name {name!r} is not defined: no host MCP server with alias {name[4:]!r} is granted to"
            f" this session (granted: {granted}); {GRANT_HINT}",
            name=name,
        )
    else:
        return None  # the user deleted or rebound a convenience name: their NameError is right
    replacement.__suppress_context__ = True
    return replacement.with_traceback(error.__traceback__)


def without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without its innermost run of frames in :data:`OWN_DIR` or the import machinery, if
    that run has one of :data:`OWN_DIR` (a new chain; else ``tb`` itself, as when the run is all
    there is)."""
    entries: list[types.TracebackType] = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    keep, ours = len(entries), False
    while keep and (kind := _kind(entries[keep - 1].tb_frame)):
        ours = ours or kind == "own"
        keep -= 1
    if not ours or keep == 0:
        return entries[0] if entries else None
    chain: types.TracebackType | None = None
    for entry in reversed(entries[:keep]):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def _kind(frame: Any) -> str:
    """ "own", "import" (the import machinery) or "" (anything else) for a frame."""
    filename = str(frame.f_code.co_filename)
    if filename.startswith(OWN_DIR):
        return "own"
    return "import" if filename.startswith(IMPORT_MACHINERY) else ""
