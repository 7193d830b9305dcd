"""The rpc wire's requests as the host checks them (docs/rpc.md).

No I/O here. :func:`parse_request` turns an untrusted ``method`` and ``params`` into a method name
and a params dict whose every value has been type- and size-checked (defaults filled in), or
raises :class:`~kernelbridge.errors.RpcError` ``invalid_params`` (``too_large`` for oversized
arguments or skill source). :func:`check_result_size` does the same for an answer.
"""

from __future__ import annotations

import json
from typing import Any

from kernelbridge.errors import RpcError
from kernelbridge.frames import MAX_RPC_BYTES

KINDS = frozenset(
    {
        "not_available",
        "denied",
        "unknown_tool",
        "invalid_params",
        "too_large",
        "busy",
        "cancelled",
        "server_error",
        "unavailable",
        "internal",
        "package_error",
    }
)
"""Every error kind of docs/rpc.md. ``unavailable`` is the kernel side's alone (no hub at all)."""

MAX_SOURCE_BYTES = 256 * 1024
"""A saved tool's source (``save_tool``)."""
MAX_DESCRIPTION_CHARS = 8 * 1024
"""A saved tool's description."""
MAX_NAME_CHARS = 256
"""Server and tool names (MCP allows 128 characters for tool names) and skill names."""
MAX_QUERY_CHARS = 1000
MAX_SEARCH_LIMIT = 50
RESPONSE_ENVELOPE_BYTES = 256
"""Room for ``{"type":"rpc_response","id":...,"result":`` around a result within MAX_RPC_BYTES."""


# method -> {param: (kind, default)}; a missing default means required.
_REQUIRED = object()
_SPECS: dict[str, dict[str, tuple[str, Any]]] = {
    "manifest": {},
    "list_servers": {},
    "discovered_servers": {"detailed": ("bool", False)},
    "describe_server": {"server": ("name", _REQUIRED)},
    "list_tools": {"server": ("name", _REQUIRED)},
    "query_tool_docs": {
        "server": ("name", _REQUIRED),
        "tool": ("optional_name", None),
        "detail": ("detail", "summary"),
    },
    "search_tool_docs": {"query": ("query", _REQUIRED), "limit": ("limit", 5)},
    "call_tool": {
        "server": ("name", _REQUIRED),
        "tool": ("name", _REQUIRED),
        "arguments": ("arguments", {}),
    },
    "save_tool": {
        "name": ("name", _REQUIRED),
        "source": ("source", _REQUIRED),
        "description": ("description", ""),
    },
    "list_skills": {},
    "load_skill": {"name": ("name", _REQUIRED)},
}
METHODS = frozenset(_SPECS)


def invalid(message: str) -> RpcError:
    return RpcError("invalid_params", message)


def parse_request(method: object, params: object) -> tuple[str, dict[str, Any]]:
    """Validate one request. Raises RpcError (``invalid_params`` or ``too_large``)."""
    if not isinstance(method, str) or method not in _SPECS:
        shown = repr(method[:60]) if isinstance(method, str) else type(method).__name__
        raise invalid(f"unknown method {shown}; methods: {', '.join(sorted(_SPECS))}")
    if not isinstance(params, dict):
        raise invalid(f"{method}: params must be a JSON object, not {_json_type(params)}")
    spec = _SPECS[method]
    unexpected = [key for key in params if key not in spec]
    if unexpected:
        shown = str(unexpected[0])[:60]
        raise invalid(f"{method}: unexpected parameter {shown!r}; parameters: {', '.join(spec) or 'none'}")
    parsed: dict[str, Any] = {}
    for key, (kind, default) in spec.items():
        if key not in params:
            if default is _REQUIRED:
                raise invalid(f"{method}: missing parameter {key!r}")
            parsed[key] = default
            continue
        parsed[key] = _check(method, key, kind, params[key])
    return method, parsed


def _check(method: str, key: str, kind: str, value: object) -> Any:
    where = f"{method}: {key!r}"
    if kind == "bool":
        if not isinstance(value, bool):
            raise invalid(f"{where} must be true or false, not {_json_type(value)}")
        return value
    if kind == "optional_name" and value is None:
        return None
    if kind in ("name", "optional_name"):
        if not isinstance(value, str) or not value:
            raise invalid(f"{where} must be a non-empty string, not {_json_type(value)}")
        if len(value) > MAX_NAME_CHARS:
            raise invalid(f"{where} is {len(value):,} characters; the limit is {MAX_NAME_CHARS}")
        return value
    if kind == "detail":
        if value not in ("summary", "full"):
            raise invalid(f"{where} must be 'summary' or 'full'")
        return value
    if kind == "query":
        if not isinstance(value, str) or not value.strip():
            raise invalid(f"{where} must be a non-empty string")
        if len(value) > MAX_QUERY_CHARS:
            raise invalid(f"{where} is {len(value):,} characters; the limit is {MAX_QUERY_CHARS}")
        return value
    if kind == "limit":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEARCH_LIMIT:
            raise invalid(f"{where} must be an integer from 1 to {MAX_SEARCH_LIMIT}")
        return value
    if kind == "arguments":
        if not isinstance(value, dict):
            raise invalid(f"{where} must be a JSON object, not {_json_type(value)}")
        size = json_size(value)
        if size is None:
            raise invalid(f"{where} is not JSON")
        if size > MAX_RPC_BYTES:
            raise RpcError("too_large", f"arguments of {size:,} bytes exceed the {MAX_RPC_BYTES:,} byte cap")
        return value
    if kind == "source":
        if not isinstance(value, str):
            raise invalid(f"{where} must be a string, not {_json_type(value)}")
        if len(value) > MAX_SOURCE_BYTES or len(value.encode(errors="replace")) > MAX_SOURCE_BYTES:
            raise RpcError("too_large", f"skill source exceeds the {MAX_SOURCE_BYTES:,} byte cap")
        return value
    if kind == "description":
        if not isinstance(value, str):
            raise invalid(f"{where} must be a string, not {_json_type(value)}")
        if len(value) > MAX_DESCRIPTION_CHARS:
            raise invalid(f"{where} is {len(value):,} characters; the limit is {MAX_DESCRIPTION_CHARS:,}")
        return value
    raise AssertionError(f"no check for {kind}")  # pragma: no cover - a bug in _SPECS


def json_size(value: object) -> int | None:
    """Bytes of ``value`` as the frame codec encodes it, or None if it is not JSON."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return len(text.encode("utf-8", errors="surrogatepass"))


def check_result_size(result: object) -> None:
    """Raise ``too_large`` if ``result`` would not fit in one rpc_response frame."""
    size = json_size(result)
    if size is None:
        raise RpcError("internal", "the result could not be encoded as JSON")
    if size > MAX_RPC_BYTES - RESPONSE_ENVELOPE_BYTES:
        raise RpcError("too_large", f"the result is {size:,} bytes; the cap is {MAX_RPC_BYTES:,} bytes")


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)
