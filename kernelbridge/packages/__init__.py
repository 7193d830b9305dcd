"""Packages through the host: ``%pip install`` for sandboxes that have no network (issue 16).

The sandbox never touches the network; the host resolves and downloads **binary wheels** for the
sandbox's platform with its own pip (never building or running anything of a package) and hands
them to the sandbox over the rpc channel, where the kernel installs them
(``kernelbridge/inside/pythonpath/mcp/_packages.py``, ``%pip`` in ``inside/kernel/pip_magic.py``).

- :mod:`.requirements`: untrusted requirement strings parsed and re-rendered by ``packaging``
  (no option, URL or path reaches pip), the policy ``KERNELBRIDGE_PACKAGES``; no I/O;
- :mod:`.pip`: the host's pip run for the sandbox's platform (resolve, download, probe), failures
  classified into one line each;
- :mod:`.cache`: the content-addressed wheel cache and the resolutions in the state directory,
  shared by sessions and bridges, bounded;
- :mod:`.service`: :class:`PackageService`, the ``packages_*`` rpc methods (plans, chunks, records,
  caps per sandbox), and :class:`WithPackages`, which routes them past the hub.

It knows nothing of sessions or MCP clients: calls arrive as :class:`~kernelbridge.hub.rpc.RpcCall`.
"""

from kernelbridge.packages.service import METHODS, PackageService, WithPackages

__all__ = ["METHODS", "PackageService", "WithPackages"]
