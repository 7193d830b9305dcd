"""The ``kernelbridge`` kernelspec: what ``jupyter console --kernel kernelbridge`` and nbclient use."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from kernelbridge import DISTRIBUTION

KERNEL_NAME = "kernelbridge"
DISPLAY_NAME = "Python 3 (kernelbridge sandbox)"
PROVISIONER_NAME = "kernelbridge-provisioner"


def kernelspec_dict(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The kernel.json contents. ``argv`` is only a placeholder for tools that show it: the
    provisioner replaces it with the tunnel command. Interrupts go through the control channel
    (message mode), which needs no signal to cross the container wall. ``env``: the settings its
    kernels start with (the provisioner reads them from the kernel's environment, where Jupyter
    puts them over its own; none of them reaches the sandbox)."""
    return {
        "argv": [
            sys.executable,
            "-m",
            "kernelbridge.jupyter.tunnel_process",
            "--connection-file",
            "{connection_file}",
        ],
        "display_name": DISPLAY_NAME,
        "language": "python",
        "interrupt_mode": "message",
        "env": dict(env or {}),
        "metadata": {
            "debugger": False,
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": {}},
        },
    }


def install_kernelspec(
    user: bool = True, prefix: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Install the kernelspec, its kernels started with the settings ``env``; returns the
    directory it was installed to.

    As ``ipykernel install``: ``user`` puts it under the user's Jupyter data directory (every
    environment's Jupyter of this user sees it), ``prefix`` under ``PREFIX/share/jupyter/kernels``
    (only a Jupyter of that prefix, e.g. ``sys.prefix``, sees it); otherwise the system directory.
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(kernelspec_dict(env), indent=2))
        return KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=KERNEL_NAME, user=user and prefix is None, prefix=prefix
        )


def visibility_note(installed: str) -> str:
    """What a user must know to see the kernel from a Jupyter in another Python environment.

    The kernelspec names kernelbridge's provisioner, which jupyter_client finds through an entry
    point of the environment *Jupyter* runs in: a Jupyter elsewhere (pipx, conda, a system
    JupyterLab) skips a kernelspec whose provisioner it cannot load.
    """
    return (
        f"for a Jupyter in another Python environment: that environment needs kernelbridge too"
        f" (`<that env>/bin/pip install {DISTRIBUTION}`: Jupyter loads the sandbox provisioner from"
        f" there), and the kernelspec must be where it looks (`kernelbridge kernelspec install"
        f" --user` is seen by every environment of this user; --prefix <that env's sys.prefix> by"
        f" that one only); check with `jupyter kernelspec list` there (installed now: {installed})"
    )
