"""IPython extension that binds the sandbox API into a kernelbridge kernel's namespace.

Loaded at kernel start with ``--IPKernelApp.extensions=["mcp._ipython"]`` (next to
``kernelbridge.inside.kernel.bounded_history``). It binds ``mcp``, ``runtime``, ``save_tool`` and an empty
``mcp_servers`` into the user namespace, and takes the rpc fd now, before any user code runs, so that
the variable and the fd never reach the kernel's child processes. The granted servers' proxies come
later, from ``mcp._kernelbridge_refresh()`` sent by the host.

The names are conveniences: the package never reads them back, so a user rebinding ``runtime`` or
deleting ``mcp`` breaks nothing but their own use of the name.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """Called by IPython once per kernel start (IPKernelApp.extensions)."""
    import mcp
    from mcp import _transport, runtime

    names = {"mcp": mcp, "runtime": runtime, "save_tool": mcp.save_tool, "mcp_servers": mcp.mcp_servers}
    ipython.user_ns.update(names)
    # Hidden names are left out of %who/%whos listings of the user's own variables.
    hidden = getattr(ipython, "user_ns_hidden", None)
    if isinstance(hidden, dict):
        hidden.update(names)
    try:
        _transport.connect()
    except mcp.McpUnavailable:
        pass  # no host: every call says so when made
