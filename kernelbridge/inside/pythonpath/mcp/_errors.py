"""The exceptions of the sandbox ``mcp`` package, and the map from rpc error kinds to them.

One class per error kind the host can answer (docs/rpc.md, "Error kinds"), each under
:class:`McpError` (``.kind``, ``.message``), so sandboxed code can catch exactly what it expects.
:class:`McpServerNotAvailable` is also a KeyError (``mcp_servers["x"]`` behaves like a dict lookup),
:class:`McpInvalidParams` also a TypeError. A tool that answers ``isError: true`` is not an
exception: its result dict says so.
"""

from __future__ import annotations

# Why 4000: an error message is shown to a model inside a traceback; a host or a hostile MCP server
# must not be able to flood the cell output (or the kernel's memory) through one message.
MAX_MESSAGE_CHARS = 4000


class McpError(Exception):
    """A host MCP call failed. ``kind`` is the rpc error kind, ``message`` the host's text."""

    kind = "internal"

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    def __str__(self) -> str:
        # KeyError (a base of McpServerNotAvailable) would otherwise print the message quoted.
        return self.message


class McpServerNotAvailable(McpError, KeyError):
    """The server is not granted to this session, or unknown. Grant it with
    ``run_python(servers=[...])``."""

    kind = "not_available"


class McpToolDenied(McpError):
    """The operator's policy denies this tool (or the whole server)."""

    kind = "denied"


class McpUnknownTool(McpError):
    """The server has no tool of that name (or no saved tool of that name, for skills)."""

    kind = "unknown_tool"


class McpInvalidParams(McpError, TypeError):
    """The arguments were rejected: wrong types, missing fields, not JSON-serializable."""

    kind = "invalid_params"


class McpTooLarge(McpError):
    """A request or a result is over ``frames.MAX_RPC_BYTES``."""

    kind = "too_large"


class McpBusy(McpError):
    """Too many calls in flight in this session (``frames.MAX_RPC_IN_FLIGHT``); retry fewer at once."""

    kind = "busy"


class McpCancelled(McpError):
    """The call was cancelled by the host: its cell timed out or the session closed."""

    kind = "cancelled"


class McpServerError(McpError):
    """The host MCP server failed (crashed, transport error, timed out); the message is the server's."""

    kind = "server_error"


class McpUnavailable(McpError):
    """No host MCP servers can be reached from this kernel."""

    kind = "unavailable"


class PackageError(McpError):
    """``%pip install`` through the host failed: no such package, no wheel for the sandbox, a
    version conflict, the index unreachable (the message says which; nothing was installed)."""

    kind = "package_error"


ERROR_CLASSES: dict[str, type[McpError]] = {
    cls.kind: cls
    for cls in (
        McpServerNotAvailable,
        McpToolDenied,
        McpUnknownTool,
        McpInvalidParams,
        McpTooLarge,
        McpBusy,
        McpCancelled,
        McpServerError,
        McpUnavailable,
        PackageError,
    )
}


def error_from_response(error: object) -> McpError:
    """The exception for an rpc ``error`` object; anything malformed becomes a plain McpError."""
    if not isinstance(error, dict):
        return McpError("the host sent a malformed error answer")
    kind = error.get("kind")
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = f"host MCP call failed ({str(kind)[:40]})"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + " [...]"
    cls = ERROR_CLASSES.get(kind, McpError) if isinstance(kind, str) else McpError
    return cls(message, kind if isinstance(kind, str) and cls is McpError else None)
