"""The servers granted to this kernel's session, and where they appear: namespace, ``mcp_servers``, modules.

:func:`refresh` (the host's silent ``mcp._kernelbridge_refresh()``) makes the kernel agree with the
``manifest``, idempotently: ``mcp_<alias>`` in the user namespace (a revoked one removed only if the
name still holds our proxy), ``mcp_servers`` (one dict for the kernel's life, updated in place) and
``mcp.servers.<alias>`` modules; importing one not granted raises ModuleNotFoundError saying so. In a
kernel no host serves, a lookup in ``mcp_servers`` or ``mcp.servers`` raises ``McpUnavailable`` with
the host's reason instead. Proxies keep no secret and grant nothing: the host checks every call.
"""

from __future__ import annotations

import importlib.abc
import sys
import types
from collections.abc import Sequence
from typing import Any

from . import _transport
from ._errors import McpError, McpServerNotAvailable, McpUnavailable
from ._proxies import ServerProxy, build_server

SERVERS_PACKAGE = "mcp.servers"
GRANT_HINT = "grant it with run_python(servers=[...]); runtime.discovered_servers() lists every server"


def no_host(consequence: str) -> None:
    """Raise McpUnavailable (the host's reason, then ``consequence``) if no host serves this
    kernel: a lookup of a server that is not bound asks before it says "not granted"."""
    __tracebackhide__ = True
    reason = _transport.unavailable()
    if reason is not None:
        raise McpUnavailable(f"{reason} ({consequence})")


class McpServers(dict[str, ServerProxy]):
    """``mcp_servers``: the granted servers' proxies by real name (an alias works too)."""

    def __missing__(self, key: str) -> ServerProxy:
        __tracebackhide__ = True
        for proxy in self.values():
            if proxy._kb_alias == key:
                return proxy
        no_host(f"so no server {key!r} is bound")
        granted = ", ".join(repr(name) for name in self) or "none"
        raise McpServerNotAvailable(
            f"Server {key!r} is not available: it is not granted to this session (granted: {granted});"
            f" {GRANT_HINT}"
        )


class Registry:
    """What the last manifest granted, and the objects made from it."""

    def __init__(self) -> None:
        self.servers = McpServers()
        self.records: list[dict[str, Any]] = []
        self.modules: dict[str, types.ModuleType] = {}  # alias -> module
        self.refreshed = False

    def apply(self, manifest: object, namespace: dict[str, Any] | None) -> dict[str, Any]:
        """Make proxies, modules and ``namespace`` match ``manifest``. Returns what changed.

        Raises McpError if the manifest itself is malformed (nothing is changed then); a malformed
        server or tool inside it is skipped.
        """
        servers = manifest.get("servers") if isinstance(manifest, dict) else None
        if not isinstance(servers, list):
            raise McpError("the host sent a malformed manifest")
        built: dict[str, tuple[ServerProxy, types.ModuleType]] = {}
        records: list[dict[str, Any]] = []
        skipped: list[str] = []
        for record in servers:
            result = build_server(record) if isinstance(record, dict) else None
            if result is None or result[0]._kb_alias in built or result[0]._kb_name in self._names(built):
                skipped.append(str(record.get("name") if isinstance(record, dict) else record)[:80])
                continue
            built[result[0]._kb_alias] = result
            records.append(result[0]._kb_record)

        # Build everything first, then swap: a failure above leaves the previous state intact.
        old_proxies = {proxy._kb_alias: proxy for proxy in self.servers.values()}
        package = sys.modules.get(SERVERS_PACKAGE)
        for alias, module in self.modules.items():
            if sys.modules.get(module.__name__) is module:
                del sys.modules[module.__name__]
            if package is not None and getattr(package, alias, None) is module:
                delattr(package, alias)
        if namespace is not None:
            for alias, proxy in old_proxies.items():
                if namespace.get(f"mcp_{alias}") is proxy:
                    del namespace[f"mcp_{alias}"]
        self.servers.clear()
        self.modules = {}
        for alias, (proxy, module) in built.items():
            self.servers[proxy._kb_name] = proxy
            self.modules[alias] = module
            sys.modules[module.__name__] = module
            if package is not None:
                setattr(package, alias, module)
            if namespace is not None:
                namespace[f"mcp_{alias}"] = proxy
        if namespace is not None:
            namespace["mcp_servers"] = self.servers
        self.records = records
        self.refreshed = True
        return {
            "servers": list(built),
            "removed": sorted(set(old_proxies) - set(built)),
            "skipped": skipped,
        }

    @staticmethod
    def _names(built: dict[str, tuple[ServerProxy, types.ModuleType]]) -> set[str]:
        return {proxy._kb_name for proxy, _ in built.values()}

    def aliases(self) -> list[str]:
        return [proxy._kb_alias for proxy in self.servers.values()]


REGISTRY = Registry()
"""The kernel's one registry: a kernel has one user namespace and one host session."""


def user_namespace() -> dict[str, Any] | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "user_ns", None)


def refresh() -> dict[str, Any]:
    """Fetch the manifest and rebind ``mcp_<alias>``, ``mcp_servers`` and ``mcp.servers.*``.

    Returns ``{"servers": [aliases bound], "removed": [aliases unbound], "skipped": [bad records]}``.
    Raises McpUnavailable without a host, McpError on a malformed manifest.
    """
    __tracebackhide__ = True
    manifest = _transport.request("manifest", {})
    return REGISTRY.apply(manifest, user_namespace())


class ServerModuleFinder(importlib.abc.MetaPathFinder):
    """Turns ``import mcp.servers.<alias>`` of a server that is not granted into a clear error.

    Granted servers never reach this finder: their modules are already in ``sys.modules``.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> None:
        prefix = SERVERS_PACKAGE + "."
        if not fullname.startswith(prefix):
            return None
        alias = fullname[len(prefix) :].split(".")[0]
        no_host(f"so {fullname} cannot be imported")
        granted = ", ".join(REGISTRY.aliases()) or "none"
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: no server with alias {alias!r} is granted to this session"
            f" (granted: {granted}); {GRANT_HINT}",
            name=fullname,
        )


def install_finder(finder: importlib.abc.MetaPathFinder) -> None:
    """Append ``finder`` to ``sys.meta_path`` once (a reloaded package must not add a second one)."""
    kind = type(finder).__qualname__
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__qualname__ != kind]
    sys.meta_path.append(finder)
