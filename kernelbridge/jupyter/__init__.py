"""jupyter_client integration: sandboxed kernels that any Jupyter client can drive.

- :mod:`~kernelbridge.jupyter.provisioner`: :class:`SandboxProvisioner`, the KernelProvisioner
  (entry point ``kernelbridge-provisioner``) whose "kernel process" is a tunnel process;
- :mod:`~kernelbridge.jupyter.tunnel_process`: that process (``python -m
  kernelbridge.jupyter.tunnel_process``): one sandbox through the host's tunnel owner;
- :mod:`~kernelbridge.jupyter.launch`: the ``Launch`` message between the two;
- :mod:`~kernelbridge.jupyter.manager`: :class:`SandboxKernelManager` (needs no installed
  kernelspec), :func:`connect_client` (a client that proved iopub delivers) and
  :func:`stop_channels` (a client's channels stopped, however soon after they started);
- :mod:`~kernelbridge.jupyter.kernelspec`: the ``kernelbridge`` kernelspec.

The bridge's own sessions do not come through here: they use :class:`kernelbridge.host.Sandbox`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.jupyter.kernelspec import KERNEL_NAME, install_kernelspec, kernelspec_dict
    from kernelbridge.jupyter.manager import (
        SandboxKernelManager,
        connect_client,
        stop_channels,
        wait_for_iopub,
    )
    from kernelbridge.jupyter.provisioner import SandboxProvisioner

__all__ = [
    "KERNEL_NAME",
    "SandboxKernelManager",
    "SandboxProvisioner",
    "connect_client",
    "install_kernelspec",
    "kernelspec_dict",
    "stop_channels",
    "wait_for_iopub",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
