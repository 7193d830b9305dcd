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

pytestmark = [pytest.mark.slow, pytest.mark.install, pytest.mark.podman]

SETUP_TIMEOUT = 900
"""The first run builds the user's image (about 80 s here, more on a busy machine)."""
CORE_TIMEOUT = 900
CORE_TESTS = ["tests/integration/test_server.py"]
CORE_SELECTION = " or ".join(
    ("state_is_kept", "errors_are", "timeout", "ignoring_interrupt", "sessions_list", "disconnecting")
)
"""The suite's core as far as a user's rights matter: sessions through the MCP server with real
sandboxes, their timeouts, restarts (signals across the user namespace) and teardown. The unit
tests start no container and run the same for anyone; the rest of test_server.py (output formats)
would add minutes here, not coverage of running as a user."""
CORE_COUNT = 6
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
    # Sessions end with the bridge (the suite's default, tests/conftest.py): these tests check
    # that nothing is left once it exits; durable sessions have their own suite.
    env = {
        "KERNELBRIDGE_STATE_DIR": str(state),
        "KERNELBRIDGE_IMAGE_PACKAGES": EXTRA,
        "KERNELBRIDGE_DURABLE": "0",
        **extra,
    }
    command = user.argv(str(venv / "bin" / "kernelbridge"), "serve", **env)
    params = StdioServerParameters(command=command[0], args=command[1:], cwd="/")
    async with Client(params, read_timeout_seconds=180) as client:
        yield client


@pytest.mark.anyio
async def test_the_users_bridge_refuses_unlimited_sandboxes(
    user_ready: TestUser, user_venv: Path, user_tmp: Path
) -> None:
    async with user_bridge(user_ready, user_venv, user_tmp / "state", KERNELBRIDGE_WARM_POOL="0") as client:
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
    env = {"KERNELBRIDGE_WARM_POOL": "0", "KERNELBRIDGE_ALLOW_UNLIMITED": "1"}
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
        f"--basetemp={user_tmp / 'pytest'}",
        *CORE_TESTS,
        "-k",
        CORE_SELECTION,
        PYTHONPATH=str(checkout),
        KERNELBRIDGE_ALLOW_UNLIMITED="1",
        KERNELBRIDGE_IMAGE_PACKAGES=EXTRA,
        PYTHONDONTWRITEBYTECODE="1",
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
