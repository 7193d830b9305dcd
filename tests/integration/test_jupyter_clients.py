"""Ordinary Jupyter clients run code in a sandbox through the installed `kernelbridge` kernelspec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from local_kernel import local_notebook_client
from nbclient import NotebookClient

from kernelbridge.session.text import strip_ansi

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


def test_the_clients_display_settings_reach_the_kernel_and_nothing_else(
    jupyter_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """COLUMNS (and the like) of the client's environment reach the sandbox kernel, so IPython lays
    out tracebacks for the client's terminal as a local kernel does; a secret beside it does not."""
    monkeypatch.setenv("COLUMNS", "52")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("KERNELBRIDGE_TEST_SECRET", "hunter2")
    monkeypatch.setenv("TERM", "xterm-256color\nINJECTED=1")  # not a terminal's name: not passed
    cells = [
        "import os\nprint(os.environ.get('COLUMNS'), os.environ.get('LANG'), os.environ.get('TERM'))\n"
        "print(sorted(k for k in os.environ if 'SECRET' in k or 'INJECTED' in k))",
        "1 / 0",
    ]
    sandbox = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(
        sandbox, kernel_name="kernelbridge", timeout=60, startup_timeout=120, allow_errors=True
    ).execute()
    # (ipykernel sets TERM to xterm-color in any kernel, local or not.)
    assert sandbox.cells[0].outputs[0]["text"] == "52 C.UTF-8 xterm-color\n[]\n"
    local = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    local_notebook_client(local, tmp_path, timeout=60, allow_errors=True).execute()
    rule = strip_ansi(sandbox.cells[1].outputs[0]["traceback"][0])
    assert rule.startswith("-" * 52) and not rule.startswith("-" * 53), rule
    # Laid out as the local kernel lays it out for the same terminal, line for line.
    assert sandbox.cells[1].outputs[0]["traceback"] == local.cells[1].outputs[0]["traceback"]
