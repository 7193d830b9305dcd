"""Packages through the host: ``%pip install`` for sandboxes that have no network (issue 16).

The sandbox never touches the network; the host resolves **binary wheels** for the sandbox's
platform with its own pip (never building or running anything of a package), fetches them within
the caps and hands them to the sandbox over the rpc channel, where the kernel installs them
(``kernelbridge/inside/pythonpath/mcp/_packages.py``, ``%pip`` in ``inside/kernel/pip_magic.py``).
Nothing the sandbox sent reaches pip as sent (:mod:`.requirements` renders it again). It knows
nothing of sessions or MCP clients: calls arrive as :class:`~kernelbridge.calls.RpcCall`.
The flow, the cache and the budgets: docs/architecture.md, "Packages and data".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.packages.service import METHODS, PackageService, WithPackages

__all__ = ["METHODS", "PackageService", "WithPackages"]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
