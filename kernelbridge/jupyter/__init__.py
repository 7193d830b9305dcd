"""jupyter_client integration: sandboxed kernels that any Jupyter client can drive."""

from kernelbridge.kernel.manager import SandboxKernelManager, connect_client, wait_for_iopub
from kernelbridge.kernel.provisioner import SandboxProvisioner
from kernelbridge.kernel.spec import KERNEL_NAME, install_kernelspec, kernelspec_dict

__all__ = [
    "KERNEL_NAME",
    "SandboxKernelManager",
    "SandboxProvisioner",
    "connect_client",
    "install_kernelspec",
    "kernelspec_dict",
    "wait_for_iopub",
]
