"""Python names for MCP servers and tools (docs/rpc.md, "Aliases").

Computed on the host only and shipped in every record, so the kernel side never has to agree
with this code on an edge case. A server alias names the proxy ``mcp_<alias>`` and the module
``mcp.servers.<alias>``; a tool alias names the proxy function. Both are identifiers:

- lowercase; each run of characters outside ``[a-z0-9_]`` becomes ``_``;
- a leading digit gets a ``_`` prefix; nothing left at all becomes ``_``;
- a Python keyword gets ``_`` appended (``import`` -> ``import_``): ``mcp.servers.import``
  could not be imported and ``def class(...)`` could not be defined;
- collisions get ``_2``, ``_3``, ... in the order the names are given (configuration order for
  servers, listing order for tools), so an earlier name keeps its alias when another appears.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable

_OUTSIDE = re.compile(r"[^a-z0-9_]+")


def alias(name: str) -> str:
    """The alias of one name, before collisions are resolved."""
    base = _OUTSIDE.sub("_", name.lower()) or "_"
    if base[0].isdigit():
        base = "_" + base
    if keyword.iskeyword(base):
        base += "_"
    return base


def assign_aliases(names: Iterable[str]) -> dict[str, str]:
    """Map each distinct name to a unique alias, in order (a repeated name keeps its first alias)."""
    aliases: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        if name in aliases:
            continue
        base = candidate = alias(name)
        n = 2
        while candidate in used:
            candidate = f"{base}_{n}"
            n += 1
        used.add(candidate)
        aliases[name] = candidate
    return aliases


def resolve(name: str, aliases: dict[str, str]) -> str | None:
    """The real name for ``name`` given as a real name or an alias, or None.

    A real name wins over an alias that equals it: with ``a-b`` configured before ``a_b``, the
    aliases are ``a_b`` and ``a_b_2``, and ``a_b`` still means the server really named ``a_b``.
    """
    if name in aliases:
        return name
    for real, given in aliases.items():
        if given == name:
            return real
    return None
