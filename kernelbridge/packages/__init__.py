"""Packages through the host: ``%pip install`` for sandboxes that have no network (issue 16).

The sandbox never touches the network; the host resolves **binary wheels** for the sandbox's
platform with its own pip (never building or running anything of a package), fetches them within
the caps and hands them to the sandbox over the rpc channel, where the kernel installs them
(``kernelbridge/inside/pythonpath/mcp/_packages.py``, ``%pip`` in ``inside/kernel/pip_magic.py``).

- :mod:`.requirements`: untrusted requirement strings parsed by ``packaging`` and rendered again
  (nothing the sandbox sent reaches pip as sent), the policy ``KERNELBRIDGE_PACKAGES``; no I/O;
- :mod:`.pip`: the host's pip run for the sandbox's platform (resolve, probe), with pip's own
  environment only and a bounded work directory, failures classified into one line each;
- :mod:`.fetch`: wheels fetched from the URLs pip resolved, their size asked first, streamed to a
  byte limit, hashed;
- :mod:`.cache`: the content-addressed wheel cache, the resolutions and the work directories in the
  state directory, shared by sessions and bridges, all of it inside one budget;
- :mod:`.supply`: :class:`~.supply.WheelSupply`, the wheels of one install brought onto the
  host (resolved, then fetched) within the session's and the cache's budgets;
- :mod:`.service`: :class:`PackageService`, the ``packages_*`` rpc methods (plans, chunks, records,
  caps per sandbox), and :class:`WithPackages`, which routes them past the hub.

It knows nothing of sessions or MCP clients: calls arrive as :class:`~kernelbridge.calls.RpcCall`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.packages.service import METHODS, PackageService, WithPackages

__all__ = ["METHODS", "PackageService", "WithPackages"]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
