"""Ordinary Jupyter clients run code in a sandbox through the installed `kernelbridge` kernelspec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.podman


def test_kernelspec_is_installed_with_the_provisioner(jupyter_env: dict[str, str]) -> None:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.provisioning import KernelProvisionerFactory

    spec = KernelSpecManager().get_kernel_spec("kernelbridge")
    assert spec.interrupt_mode == "message"
    assert KernelProvisionerFactory.instance().is_provisioner_available(spec)


def test_jupyter_console_runs_code_in_the_sandbox(jupyter_env: dict[str, str]) -> None:
    console = Path(sys.executable).with_name("jupyter-console")
    result = subprocess.run(
        [str(console), "--kernel", "kernelbridge", "--simple-prompt"],
        input="import os\nprint('answer', 6 * 7, os.getuid())\nexit\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **jupyter_env},
        check=False,
    )
    assert "answer 42 65534" in result.stdout, result.stdout + result.stderr


def test_nbclient_executes_a_notebook_in_the_sandbox(jupyter_env: dict[str, str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os\nvalue = 20 + 1"),
        nbformat.v4.new_code_cell("print(value * 2, os.getuid())"),
    ]
    NotebookClient(nb, kernel_name="kernelbridge", timeout=60, startup_timeout=120).execute()
    assert nb.cells[1].outputs[0]["text"] == "42 65534\n"
