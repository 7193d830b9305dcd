"""Suite-wide fixtures and checks. Every sandbox a test starts must be gone when the suite ends.

The fixtures every suite shares live here once (``anyio_backend``, ``sandbox_image``); what the
suites that start real bridges share is ``bridge_harness`` (importable: ``tests/`` is on
``sys.path``).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator

import anyio
import pytest

from kernelbridge.config import load_settings
from kernelbridge.runtime import cli_runtime

# Every sandbox this test run starts carries this label (the settings pass it on, and the server
# fixtures hand it to the bridges they spawn), so the check below sees this run's containers only,
# whatever other test runs or bridges share the engine.
TEST_RUN_LABEL = "kernelbridge.test-run"
TEST_RUN = uuid.uuid4().hex[:12]
os.environ["KERNELBRIDGE_LABELS"] = f"{TEST_RUN_LABEL}={TEST_RUN}"
# Sessions outlive their bridge by default (issue 15); the suites that are not about that test
# bridges whose sessions end with them, so that no sandbox runs on after a test. The durable
# suite (tests/integration/test_durable_sessions.py) sets KERNELBRIDGE_DURABLE=1 for its bridges.
os.environ.setdefault("KERNELBRIDGE_DURABLE", "0")

# Containers end asynchronously (`--rm` after the agent exits); give them this long to go.
LEFTOVER_GRACE = 20.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="also run the long soak tests (tests/load)")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """asyncio for every async test and fixture: pyzmq's sockets (jupyter_client's, the tunnel's)
    are asyncio-only. Module-scoped, so that module-scoped async fixtures (a bridge per module)
    can use it."""
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The current sandbox image of the configured extra packages, built once if missing or stale
    (about two minutes); skips without podman (``bridge_harness.ensure_image``)."""
    from bridge_harness import ensure_image  # the MCP client it imports is not every test's

    return ensure_image()


def leftover_containers() -> list[str]:
    """Sandbox containers started by this test run (by the test process or a bridge it spawned),
    each with what says where it came from: its state, whether it was durable (a bridge spawned
    without the suite's KERNELBRIDGE_DURABLE=0 lets its sessions run on), its bridge's pid."""
    runtime = cli_runtime(load_settings())
    return [
        f"{c.name} ({c.state.value}, durable={c.durable}, bridge pid {c.owner_pid})"
        for c in anyio.run(runtime.list, {TEST_RUN_LABEL: TEST_RUN})
    ]


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind() -> Iterator[None]:
    yield
    if shutil.which("podman") is None and shutil.which("docker") is None:
        return
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = leftover_containers()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = leftover_containers()
    assert not left, f"containers left behind by the tests: {left}"


# Tests that share a machine-wide resource run in one xdist worker, one after another: the
# runtime suite starts one dockerd and makes veth pairs of fixed numbers; the install suite builds
# the distributions once and shares one unprivileged user. Every other file is a group of its own,
# so its module-scoped fixtures (a bridge, a sandbox) start once. `make test` runs two workers.
SHARED_GROUPS = {"runtime": "engines", "install": "install"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = os.path.dirname(__file__)
    for item in items:
        relative = os.path.relpath(str(item.path), root)
        group = SHARED_GROUPS.get(relative.split(os.sep, 1)[0], relative)
        item.add_marker(pytest.mark.xdist_group(name=group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run ungrouped: a pytest that xdist cannot group with would spread dockerd's
    tests over both workers, and one worker would stop it under the other."""
    if session.config.getoption("loadgroup", default=False) and session.items:
        if "@" not in session.items[0].nodeid:
            raise pytest.UsageError("pytest-xdist did not apply the xdist_group marks (pytest >= 9.2?)")
