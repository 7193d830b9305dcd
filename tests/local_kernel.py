"""nbclient on a local ``python3`` kernel (the venv's ipykernel), the reference that sandboxes are
compared with, its sockets on IPC endpoints of its own.

Over TCP, jupyter_client picks a kernel's five ports by binding and releasing them before the
kernel binds them, and with four test workers starting bridges, sandboxes and kernels another
process can take one in between: the kernel dies with "Address already in use" before it answers
kernel_info (seen in a clean clone's `make test`). Files in a fresh directory cannot be taken."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from nbclient import NotebookClient
from nbformat import NotebookNode
from traitlets.config import Config


def local_notebook_client(nb: NotebookNode, where: Path, **kwargs: Any) -> NotebookClient:
    """A ``NotebookClient`` of ``nb`` on a new local ``python3`` kernel whose IPC endpoints are in a
    new directory under ``where`` (unique to this kernel: kernels started at once never share)."""
    endpoints = Path(tempfile.mkdtemp(prefix="k", dir=where))
    config = Config({"KernelManager": {"transport": "ipc", "ip": str(endpoints / "kernel")}})
    return NotebookClient(nb, kernel_name="python3", config=config, **kwargs)
