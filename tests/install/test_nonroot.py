"""kernelbridge as an unprivileged user: `kernelbridge setup --with six` (mmdebstrap in unshare
mode, rootless podman with overlay storage, an extra package in the image), a bridge that refuses
unlimited sandboxes unless allowed, and the core of the test suite run as that user.

On this machine (cgroups v1, hybrid) rootless podman cannot enforce memory or pid limits, so the
user's bridge must refuse sandboxes until KERNELBRIDGE_ALLOW_UNLIMITED=1, and then say so.
Everything the user does uses the image with the extra package (one image build for the user,
cached in its storage), so the extra-packages path is tested end to end on the way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from install_harness import REPO, TestUser, run
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

SETUP_TIMEOUT = 900
"""The first run builds the user's image (2-5 minutes here, more on a busy machine)."""
CORE_TIMEOUT = 900
pytestmark = [
    pytest.mark.slow,
    pytest.mark.install,
    pytest.mark.podman,
    # The first test pays for the module's setup (the user's own image build), past the suite's
    # 300 s per test on a new machine; each step keeps its own bound above.
    pytest.mark.timeout(SETUP_TIMEOUT + CORE_TIMEOUT),
]
CORE_TESTS = ["tests/integration/test_server.py"]
CORE_SELECTION = " or ".join(
    ("state_is_kept", "errors_are", "timeout", "ignoring_interrupt", "sessions_list", "disconnecting")
)
"""The suite's core as far as a user's rights matter: sessions through the MCP server with real
sandboxes, their timeouts, restarts (signals across the user namespace) and teardown. The unit
tests start no container and run the same for anyone; the rest of test_server.py (output formats)
would add minutes here, not coverage of running as a user."""
CORE_COUNT = 7
EXTRA = "six"
"""A small pure-Python package the recipe does not install."""


def leftovers(user: TestUser) -> list[str]:
    """The user's containers of this test run (the suite's own check sees root's podman only)."""
    label = user.env()["KERNELBRIDGE_LABELS"]
    proc = run(
        user.argv("podman", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"),
        timeout=60,
        cwd="/",
    )
    return proc.stdout.split()


def remove_detached_warm(user: TestUser, state: Path) -> None:
    """The warm pool's sandbox the user's bridge left (no session has it: nothing closes it)."""
    from kernelbridge.host.container import STATE_LABEL, state_identity

    label = f"label={STATE_LABEL}={state_identity(state)}"
    found = run(user.argv("podman", "ps", "-aq", "--filter", label), timeout=60, cwd="/").stdout.split()
    if found:
        run(user.argv("podman", "rm", "-f", "-t", "0", *found), timeout=120, cwd="/")


@pytest.fixture(scope="module")
def user_ready(test_user: TestUser, user_venv: Path) -> TestUser:
    """`kernelbridge setup --with six` as the user: checks, storage driver, image, doctor."""
    kernelbridge = str(user_venv / "bin" / "kernelbridge")
    proc = subprocess.run(
        test_user.argv(kernelbridge, "setup", f"--with={EXTRA}", KERNELBRIDGE_ALLOW_UNLIMITED="1"),
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT,
        cwd="/",
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "running as a normal user" in proc.stdout
    assert "FAIL" not in proc.stdout
    # Limits cannot be enforced here; doctor says so (warn, since the user allowed it).
    assert "warn  runtime" in proc.stdout and "rootless" in proc.stdout
    # The printed mcpServers entry carries what the bridge needs to find this image.
    assert f'"KERNELBRIDGE_IMAGE_PACKAGES": "{EXTRA}"' in proc.stdout
    driver = run(
        test_user.argv("podman", "info", "--format", "{{.Store.GraphDriverName}}"), timeout=60, cwd="/"
    )
    assert driver.stdout.strip() == "overlay"
    return test_user


@asynccontextmanager
async def user_bridge(user: TestUser, venv: Path, state: Path, **extra: str) -> AsyncIterator[Client]:
    """The user's bridge, every setting at its default but the image of extra packages (the user's
    input): its sessions outlive it, as they do for that user."""
    env = {"KERNELBRIDGE_STATE_DIR": str(state), "KERNELBRIDGE_IMAGE_PACKAGES": EXTRA, **extra}
    command = user.argv(str(venv / "bin" / "kernelbridge"), "serve", **env)
    params = StdioServerParameters(command=command[0], args=command[1:], cwd="/")
    async with Client(params, read_timeout_seconds=180) as client:
        yield client


@pytest.mark.anyio
async def test_the_users_bridge_refuses_unlimited_sandboxes(
    user_ready: TestUser, user_venv: Path, user_tmp: Path
) -> None:
    async with user_bridge(user_ready, user_venv, user_tmp / "state") as client:
        refused = await client.call_tool("run_python", {"code": "1 + 1"})
        capabilities = (await client.read_resource("kernelbridge://capabilities")).contents[0].text
    assert refused.is_error
    text = refused.content[0].text
    assert "ignores memory and process limits" in text and "KERNELBRIDGE_ALLOW_UNLIMITED=1" in text
    assert "Sandboxes cannot start right now" in capabilities
    assert leftovers(user_ready) == []


@pytest.mark.anyio
async def test_allowed_unlimited_sandboxes_are_declared(
    user_ready: TestUser, user_venv: Path, user_tmp: Path
) -> None:
    # What setup tells this user to set: their rootless podman on cgroup v1 cannot enforce limits.
    env = {"KERNELBRIDGE_ALLOW_UNLIMITED": "1"}
    async with user_bridge(user_ready, user_venv, user_tmp / "state", **env) as client:
        first = await client.call_tool("run_python", {"code": "import os\nos.getuid()"})
        second = await client.call_tool("run_python", {"code": "import six\nsix.__name__"})
        capabilities = (await client.read_resource("kernelbridge://capabilities")).contents[0].text
    assert not first.is_error, first.content
    assert first.structured_content["result"] == "65534"
    assert "does not enforce memory or process limits" in first.content[0].text
    assert second.structured_content["result"] == "'six'"
    packages = capabilities.split("Python packages in the sandbox image:")[1].splitlines()[0]
    assert f"{EXTRA}==" in packages
    assert "Limits are NOT enforced here" in capabilities
    assert "Limits: memory 512m" not in capabilities
    # The session runs on, detached, for the user's next client; closing it leaves nothing.
    kernelbridge = str(user_venv / "bin" / "kernelbridge")
    state = {"KERNELBRIDGE_STATE_DIR": str(user_tmp / "state"), **env}
    listed = run(user_ready.argv(kernelbridge, "sessions", "--json", **state), timeout=60, cwd="/")
    assert [(s["name"], s["state"]) for s in json.loads(listed.stdout)] == [("default", "detached")], listed
    run(user_ready.argv(kernelbridge, "sessions", "close", "default", **state), timeout=120, cwd="/")
    remove_detached_warm(user_ready, user_tmp / "state")
    assert leftovers(user_ready) == []


CHECKOUT_PARTS = ("kernelbridge", "sandbox_kernel_image", "tests", "pyproject.toml")
"""What the core suite needs of the checkout (kernelbridge/sandbox_kernel_image is a symlink to
the recipe, kept as one)."""


def copy_checkout(dest: Path, uid: int) -> Path:
    """The parts of the checkout the suite needs, owned by the user: a checkout may live where the
    user cannot read (CI clones under /root)."""
    for part in CHECKOUT_PARTS:
        source = REPO / part
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(source, dest / part, symlinks=True, ignore=ignore)
        else:
            shutil.copyfile(source, dest / part)
    for path in [dest, *dest.rglob("*")]:
        os.lchown(path, uid, -1)
    return dest


def test_the_core_suite_passes_as_the_user(user_ready: TestUser, user_venv: Path, user_tmp: Path) -> None:
    """The MCP server tests, run by the user with the checkout's code (PYTHONPATH, a copy the user
    owns) and the user's own rootless podman."""
    checkout = copy_checkout(user_tmp / "checkout", user_ready.uid)
    argv = user_ready.argv(
        str(user_venv / "bin" / "python"),
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        # nbformat (which test_server.py imports) imported first, as a plugin: imported in the
        # middle of collection, at that depth of the stack, CPython 3.11 maps and unmaps a frame
        # chunk on nearly every call of the schema parser it builds (some 350,000 mmap/munmap
        # pairs, 3 to 4 CPU-seconds of the run's 13). Nothing else of the run changes.
        "-p",
        "nbformat",
        f"--basetemp={user_tmp / 'pytest'}",
        *CORE_TESTS,
        "-k",
        CORE_SELECTION,
        PYTHONPATH=str(checkout),
        KERNELBRIDGE_ALLOW_UNLIMITED="1",
        KERNELBRIDGE_IMAGE_PACKAGES=EXTRA,
    )
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=CORE_TIMEOUT, cwd=checkout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"{CORE_COUNT} passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-2000:]


def test_setup_without_the_setting_prints_an_entry_that_works_here(
    user_ready: TestUser, user_venv: Path
) -> None:
    """Issue 18: on this rootless cgroup-v1 host, setup run without KERNELBRIDGE_ALLOW_UNLIMITED
    used to print an entry every call of which was refused, and doctor skipped the image and
    kernel checks. Now the entry carries the setting (said why), and every check runs."""
    kernelbridge = str(user_venv / "bin" / "kernelbridge")
    proc = subprocess.run(
        user_ready.argv(kernelbridge, "setup", f"--with={EXTRA}"),
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT,
        cwd="/",
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    assert "ignores memory and pid limits" in out and "without which every call is refused" in out
    entry = json.loads(out[out.index('{\n  "mcpServers"') :])["mcpServers"]["python"]
    assert entry["env"]["KERNELBRIDGE_ALLOW_UNLIMITED"] == "1"
    assert entry["env"]["KERNELBRIDGE_IMAGE_PACKAGES"] == EXTRA
    assert entry["command"] == kernelbridge and entry["args"] == ["serve"]
    for check in ("image", "limits", "kernel"):
        assert any(line.split()[1:2] == [check] and not line.startswith("skip") for line in out.splitlines()
                   if line.startswith(("ok ", "warn ", "FAIL "))), check  # fmt: skip
    assert "degraded: runtime" in out


def test_replay_and_the_kernelspec_start_sandboxes_as_the_bridge_does(
    user_ready: TestUser, user_venv: Path, user_tmp: Path
) -> None:
    """Issue 23: on this rootless cgroup-v1 host `kernelbridge replay` ran its sandbox unlimited,
    unasked, and the kernelspec `kernelbridge kernelspec install` wrote (an empty env) was refused
    by its own tunnel. Now replay refuses in one line unless allowed, and the kernelspec carries
    what this host needs, so `jupyter nbconvert --execute` runs with it."""
    import nbformat

    bin_dir = user_venv / "bin"
    notebook = user_tmp / "nb.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import six\nprint(six.__name__)")])
    nb.metadata["kernelspec"] = {"name": "kernelbridge", "display_name": "kernelbridge", "language": "python"}
    nbformat.write(nb, notebook)
    os.chown(notebook, user_ready.uid, -1)
    settings = {"KERNELBRIDGE_STATE_DIR": str(user_tmp / "state"), "KERNELBRIDGE_IMAGE_PACKAGES": EXTRA}

    def as_user(*command: str, **env: str) -> subprocess.CompletedProcess[str]:
        argv = user_ready.argv(*command, **settings, **env)
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/", check=False)

    refused = as_user(str(bin_dir / "kernelbridge"), "replay", str(notebook))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "ignores memory and process limits" in line and "KERNELBRIDGE_ALLOW_UNLIMITED=1" in line, line
    allowed = as_user(
        str(bin_dir / "kernelbridge"), "replay", str(notebook), KERNELBRIDGE_ALLOW_UNLIMITED="1"
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert allowed.stdout.startswith("note: this host's container runtime ignores memory and process limits")

    installed = as_user(
        str(bin_dir / "kernelbridge"), "kernelspec", "install", "--prefix", str(user_tmp / "prefix")
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "ignores memory and pid limits" in installed.stdout, installed.stdout
    spec = user_tmp / "prefix" / "share" / "jupyter" / "kernels" / "kernelbridge" / "kernel.json"
    env = json.loads(spec.read_text())["env"]
    assert env["KERNELBRIDGE_ALLOW_UNLIMITED"] == "1" and env["KERNELBRIDGE_IMAGE_PACKAGES"] == EXTRA
    jupyter_path = str(user_tmp / "prefix" / "share" / "jupyter")
    executed = subprocess.run(
        user_ready.argv(str(bin_dir / "jupyter"), "nbconvert", "--to", "notebook", "--execute",
                        "--output", "done.ipynb", str(notebook), JUPYTER_PATH=jupyter_path,
                        KERNELBRIDGE_STATE_DIR=str(user_tmp / "state")),
        capture_output=True, text=True, timeout=300, cwd="/", check=False,
    )  # fmt: skip
    assert executed.returncode == 0, executed.stderr[-3000:]
    done = nbformat.read(user_tmp / "done.ipynb", as_version=4)
    assert done.cells[0].outputs[0]["text"] == "six\n"
    assert leftovers(user_ready) == []
