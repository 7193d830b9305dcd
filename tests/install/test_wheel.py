"""kernelbridge installed from its built distributions, used from outside any checkout.

The wheel is the one `python -m build` makes from the sdist, so this covers `pip install` of the
wheel and `pipx`/`uv tool install` of the sdist (they build the same wheel the same way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_harness import uses_state_dir
from install_harness import PIP_TIMEOUT, REPO, Dists, run
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from kernelbridge import image

pytestmark = [pytest.mark.slow, pytest.mark.install, pytest.mark.podman]

RECIPE = [f"kernelbridge/sandbox_kernel_image/{name}" for name in image.RECIPE_FILES]


def test_the_distributions_carry_the_recipe_and_the_licence(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        for name in RECIPE:
            assert name in names
            # Files, not a symlink: the content is the checkout's recipe.
            assert wheel.read(name) == (REPO / "sandbox_kernel_image" / Path(name).name).read_bytes()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
        assert "kernelbridge/inside/agent/__main__.py" in names
        # The code that runs inside, and the packages of the host side (every one, not only
        # the top-level modules: packages.find must see them).
        assert any(n.startswith(f"{image.INSIDE_PACKAGE}/") and n.endswith(".py") for n in names)
        for module in (
            "image/recipe.py",
            "runtime/engine/api.py",
            "runtime/cli/images.py",
            "testing/runtime.py",
        ):
            assert f"kernelbridge/{module}" in names, module
        metadata = next(wheel.read(n) for n in names if n.endswith(".dist-info/METADATA")).decode()
        assert "License-Expression: MIT" in metadata
    with tarfile.open(dists.sdist) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
        for name in [*RECIPE, "LICENSE"]:
            assert members[name].isfile(), name


@pytest.fixture(scope="module")
def venv(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv outside the checkout with the wheel (and its dependencies) installed.

    Without pip's bytecode (a third of the install's CPU, for some 3,000 modules, most of which
    these tests never import): the commands below write it for those they import
    (:func:`user_environ`)."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", str(path)], timeout=120)
    pip = [str(path / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    run([*pip, str(dists.wheel)], timeout=PIP_TIMEOUT)
    yield path
    shutil.rmtree(path, ignore_errors=True)  # ~13,000 files (the tools' virtualenv says why)


def user_environ(**env: str) -> dict[str, str]:
    """This process's environment but PYTHONDONTWRITEBYTECODE, which a user's shell does not set
    (a test machine's may): the installation's commands cache their bytecode, as a user's do."""
    environ = {**os.environ, **env}
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return environ


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory far from the checkout."""
    path = tmp_path / "somewhere"
    path.mkdir()
    return path


def kernelbridge(venv: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = user_environ(KERNELBRIDGE_STATE_DIR=str(uses_state_dir(cwd / "state")), **env)
    environ.pop("PYTHONPATH", None)
    return run([str(venv / "bin" / "kernelbridge"), *args], timeout=PIP_TIMEOUT, cwd=cwd, env=environ)


def test_the_installed_package_hashes_like_the_checkout(venv: Path, elsewhere: Path) -> None:
    probe = (
        "import kernelbridge, kernelbridge.image as i; print(kernelbridge.__file__); print(i.agent_hash())"
    )
    proc = run([str(venv / "bin" / "python"), "-c", probe], timeout=60, cwd=elsewhere, env=user_environ())
    location, agent = proc.stdout.split()
    assert Path(location).is_relative_to(venv), "imported the checkout, not the installed package"
    assert agent == image.agent_hash()


def test_image_build_and_status_from_any_directory(venv: Path, elsewhere: Path, sandbox_image: str) -> None:
    # The checkout's image is this installation's image too: the build finds it current.
    built = kernelbridge(venv, "image", "build", cwd=elsewhere)
    assert f"sandbox image {sandbox_image} is current" in built.stdout
    status = kernelbridge(venv, "image", "status", cwd=elsewhere)
    assert status.stdout.strip() == f"{sandbox_image}: current"


@pytest.mark.anyio
async def test_a_real_session_with_the_installed_package(
    venv: Path, elsewhere: Path, sandbox_image: str
) -> None:
    params = StdioServerParameters(
        command=str(venv / "bin" / "kernelbridge"),
        args=["serve"],
        env={
            "KERNELBRIDGE_STATE_DIR": str(uses_state_dir(elsewhere / "state")),
            "KERNELBRIDGE_LABELS": os.environ["KERNELBRIDGE_LABELS"],
            "PATH": os.environ["PATH"],
        },
        cwd=str(elsewhere),
    )
    async with Client(params, read_timeout_seconds=120) as client:
        first = await client.call_tool(
            "run_python", {"code": "import numpy as np\nx = int(np.arange(7).sum()) * 2"}
        )
        second = await client.call_tool("run_python", {"code": "x"})
        capabilities = await client.read_resource("kernelbridge://capabilities")
    assert not first.is_error, first.content
    assert second.structured_content["result"] == "42"
    assert "Python packages in the sandbox image: ipykernel==" in capabilities.contents[0].text


def test_kernelspec_install_locations(venv: Path, elsewhere: Path) -> None:
    home = elsewhere / "home"
    user = kernelbridge(venv, "kernelspec", "install", "--user", cwd=elsewhere, HOME=str(home))
    assert (home / ".local/share/jupyter/kernels/kernelbridge/kernel.json").is_file()
    assert "another Python environment" in user.stdout
    kernelbridge(venv, "kernelspec", "install", "--sys-prefix", cwd=elsewhere)
    spec = json.loads((venv / "share/jupyter/kernels/kernelbridge/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "kernelbridge-provisioner"
    kernelbridge(venv, "kernelspec", "install", "--prefix", str(elsewhere / "p"), cwd=elsewhere)
    assert (elsewhere / "p/share/jupyter/kernels/kernelbridge/kernel.json").is_file()


def test_setup_as_root_finds_everything_in_place(venv: Path, elsewhere: Path, sandbox_image: str) -> None:
    """`kernelbridge setup` of an installed package: nothing to install here, the image is current,
    doctor passes, and the printed mcpServers entry names this installation."""
    if os.geteuid() != 0:
        pytest.skip("as a normal user, setup is tested in test_nonroot.py")
    setup = kernelbridge(venv, "setup", cwd=elsewhere)
    assert "running as root" in setup.stdout and "installing" not in setup.stdout
    assert f"sandbox image {sandbox_image} is current" in setup.stdout
    assert "FAIL" not in setup.stdout
    entry = json.loads(setup.stdout[setup.stdout.index("{") :])
    assert entry["mcpServers"]["python"]["command"] == str(venv / "bin" / "kernelbridge")


def test_demo_runs_from_the_installed_package(venv: Path, elsewhere: Path, sandbox_image: str) -> None:
    # (The transcript itself shows a sandboxed Python traceback on purpose; the command must not.)
    demo = kernelbridge(venv, "demo", cwd=elsewhere)
    assert "Traceback" not in demo.stderr, demo.stderr
