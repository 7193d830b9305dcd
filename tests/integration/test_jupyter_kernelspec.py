"""The kernelspec carries the settings it was installed with (issue 23): ``kernelbridge kernelspec
install`` writes into its ``env`` what ``setup``'s ``mcpServers`` entry carries, and the kernels
Jupyter starts from it use them, whatever the Jupyter's own environment; a refused start says
its one line in the client's log. The real console script, real ``jupyter nbconvert --execute``,
real sandboxes. (tests/install/test_nonroot.py runs the rootless cgroup-v1 case, where the
kernelspec must carry KERNELBRIDGE_ALLOW_UNLIMITED.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from bridge_harness import KERNELBRIDGE

pytestmark = pytest.mark.podman

JUPYTER = Path(sys.executable).with_name("jupyter")
MEMORY_PROBE = """
from pathlib import Path
for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    if Path(path).exists():
        print(int(Path(path).read_text()) // 2**20, "MiB")
        break
"""


def install(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``kernelbridge kernelspec install --prefix`` with ``env`` over this process's environment."""
    return subprocess.run(
        [str(KERNELBRIDGE), "kernelspec", "install", "--prefix", str(tmp_path / "prefix")],
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def execute(tmp_path: Path, code: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``jupyter nbconvert --execute`` of one cell with the kernelspec of ``install``, from a
    Jupyter whose environment has none of the kernelspec's settings."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "kernelbridge", "display_name": "kernelbridge", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(code)]
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    nbformat.write(nb, work / "nb.ipynb")
    env = {key: value for key, value in os.environ.items() if not key.startswith("KERNELBRIDGE_MEMORY")}
    env["JUPYTER_PATH"] = str(tmp_path / "prefix" / "share" / "jupyter")
    result = subprocess.run(
        [str(JUPYTER), "nbconvert", "--to", "notebook", "--execute", "--output", "done.ipynb",
         str(work / "nb.ipynb")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    return result, work / "done.ipynb"


def kernel_env(tmp_path: Path) -> dict[str, str]:
    spec = tmp_path / "prefix" / "share" / "jupyter" / "kernels" / "kernelbridge" / "kernel.json"
    return dict(json.loads(spec.read_text())["env"])


def test_the_kernelspec_carries_the_settings_it_was_installed_with(
    tmp_path: Path, sandbox_image: str
) -> None:
    # KERNELBRIDGE_MEMORY is what this test is about: a setting only the kernelspec carries.
    installed = install(
        tmp_path, KERNELBRIDGE_MEMORY="300m", KERNELBRIDGE_HTTP_TOKENS="secret-token-xyz-1234"
    )
    assert installed.returncode == 0, installed.stderr
    (said,) = [line for line in installed.stdout.splitlines() if line.startswith("its kernels start with")]
    assert "KERNELBRIDGE_MEMORY" in said and "KERNELBRIDGE_HTTP_TOKENS" not in said, said
    env = kernel_env(tmp_path)
    assert env["KERNELBRIDGE_MEMORY"] == "300m" and env["KERNELBRIDGE_STATE_DIR"] == str(tmp_path / "state")
    assert "KERNELBRIDGE_HTTP_TOKENS" not in env  # secrets stay out, as in setup's entry
    result, done = execute(tmp_path, MEMORY_PROBE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert nbformat.read(done, as_version=4).cells[0].outputs[0]["text"] == "300 MiB\n"


def test_a_refused_kernel_start_says_its_one_line_in_the_clients_log(
    tmp_path: Path, sandbox_image: str
) -> None:
    installed = install(tmp_path, KERNELBRIDGE_IMAGE="localhost/kernelbridge-sandbox:not-there")
    assert installed.returncode == 0, installed.stderr
    result, _ = execute(tmp_path, "print(1)")
    assert result.returncode != 0
    said = [
        line
        for line in result.stderr.splitlines()
        if "kernelbridge: the sandbox kernel did not start" in line
    ]
    assert len(said) == 1, result.stderr[-3000:]
    assert "localhost/kernelbridge-sandbox:not-there is missing; run `kernelbridge image build`" in said[0]
    assert said[0].lstrip().startswith("[NbConvertApp] ERROR")
