"""jupyter_client integration: sandboxed kernels that any Jupyter client can drive.

The provisioner's entry point is ``kernelbridge-provisioner``; :class:`SandboxKernelManager` needs no
installed kernelspec. The bridge's own sessions do not come through here: they use
:class:`kernelbridge.host.Sandbox`.
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
