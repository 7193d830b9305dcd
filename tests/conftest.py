"""Suite-wide fixtures and checks. Every sandbox a test starts must be gone when the suite ends.

The fixtures every suite shares live here once (``anyio_backend``, ``sandbox_image``); what the
suites that start real bridges share is ``bridge_harness`` (importable: ``tests/`` is on
``sys.path``).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import scale

from kernelbridge.config import load_settings
from kernelbridge.runtime import cli_runtime
from kernelbridge.runtime.reaper import pid_alive

# Every sandbox this test run starts carries this label (the settings pass it on, and the server
# fixtures hand it to the bridges they spawn), so the check below sees this run's containers only,
# whatever other test runs or bridges share the engine.
TEST_RUN_LABEL = "kernelbridge.test-run"
TEST_RUN = uuid.uuid4().hex[:12]
os.environ["KERNELBRIDGE_LABELS"] = f"{TEST_RUN_LABEL}={TEST_RUN}"
# Every other setting is the product's default (sessions outlive their bridge, a warm pool of
# one, ...): the sandboxes a test's bridges leave detached are removed after it (below).

# Containers end asynchronously (`--rm` after the agent exits); give them this long to go.
LEFTOVER_GRACE = 20.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="also run the soak tests (tests/load), and the repetitive tests at full count (tests/scale.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """The repetitive tests' counts follow ``--soak`` (``tests/scale.py``), in every xdist worker;
    test modules are kept compiled whatever the shell says (below)."""
    scale.SOAK = config.getoption("--soak")
    # pytest keeps its assertion-rewritten test modules (tests/**/__pycache__) only where bytecode
    # may be written: under a shell's PYTHONDONTWRITEBYTECODE=1, as on these machines, every worker
    # parsed and rewrote all ~200 test modules again at each run (collection 9.4 CPU-s per worker,
    # 4.4 from the cache). This process only: what the tests start keeps the user's setting.
    sys.dont_write_bytecode = False
    # As in every kernelbridge command (kernelbridge.lazy): jsonschema, under the nbformat that
    # many test modules import, would build its unused iri grammar first (1.2 CPU-s per worker).
    # Only this one of lazy.NEVER_IMPORTED: hypothesis loads trio's plugin as it is imported.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: not importable


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """asyncio for every async test and fixture: pyzmq's sockets (jupyter_client's, the tunnel's)
    are asyncio-only. Module-scoped, so that module-scoped async fixtures (a bridge per module)
    can use it."""
    return "asyncio"


@pytest.fixture(scope="session")
def kube_cluster(sandbox_image: str) -> Iterator[Any]:
    """The development cluster (``scripts/kube-cluster.sh``), up for the run; skips with one line
    when its binaries are not built (``kube_harness.cluster_for_run``)."""
    from kube_harness import cluster_for_run

    yield from cluster_for_run(sandbox_image, TEST_RUN, also=(str(os.getpid()),))


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The current sandbox image of the configured extra packages, built once if missing or stale
    (about two minutes); skips without podman (``bridge_harness.ensure_image``)."""
    from bridge_harness import ensure_image  # the MCP client it imports is not every test's

    return ensure_image()


def leftover_containers() -> list[str]:
    """Sandbox containers started by this test run (by the test process or a bridge it spawned),
    each with what says where it came from: its state, whether it was durable (one of a state
    directory the harness did not know, e.g. a bridge spawned by hand), its bridge's pid."""
    runtime = cli_runtime(load_settings())
    return [
        f"{c.name} ({c.state.value}, durable={c.durable}, bridge pid {c.owner_pid})"
        for c in anyio.run(runtime.list, {TEST_RUN_LABEL: TEST_RUN})
    ]


def end_detached_sandboxes(*, every: bool = False) -> None:
    """The sandboxes bridges of this process left detached on state directories they no longer
    use (``bridge_harness.end_detached_sandboxes``); nothing if no bridge was started."""
    harness = sys.modules.get("bridge_harness")
    if harness is not None and (harness.STATE_DIRS or every):
        harness.end_detached_sandboxes(every=every)


@pytest.fixture(autouse=True)
def detached_sandboxes_removed_after_each_test() -> Iterator[None]:
    yield
    end_detached_sandboxes()


@pytest.fixture(scope="module", autouse=True)
def detached_sandboxes_removed_after_each_module() -> Iterator[None]:
    yield  # after the module's own fixtures (its bridge) are gone
    end_detached_sandboxes()


def end_detached_warm_sandboxes() -> list[str]:
    """Remove this run's warm-pool sandboxes that a bridge which has exited left detached: kept
    by design for the next bridge's pool (durable, the default), bounded by the idle timeout,
    and left by bridges a test spawned on a state directory of its own that the harness did not
    know. A session's detached sandbox, or any non-durable one, is still a leftover."""
    runtime = cli_runtime(load_settings())
    found = anyio.run(runtime.list, {TEST_RUN_LABEL: TEST_RUN})
    warm = [
        c
        for c in found
        if c.durable and "-warm-" in c.name and not (c.owner_pid and pid_alive(c.owner_pid, c.owner_start))
    ]
    if warm:
        anyio.run(runtime.remove, [c.id for c in warm])
    return [c.name for c in warm]


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind() -> Iterator[None]:
    yield
    if shutil.which("podman") is None and shutil.which("docker") is None:
        return
    end_detached_sandboxes()
    if swept := end_detached_warm_sandboxes():
        print(f"\ndetached warm sandboxes of exited bridges removed: {swept}")
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = leftover_containers()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        end_detached_sandboxes(every=True)
        left = leftover_containers()
    assert not left, f"containers left behind by the tests: {left}"


# Tests that share a machine-wide resource run in one xdist worker, one after another: the
# runtime suite starts one dockerd and makes veth pairs of fixed numbers; the install suite builds
# the distributions once and shares one unprivileged user; the kube tier shares one cluster. Every
# other file is a group of its own, so its module-scoped fixtures (a bridge, a sandbox) start once.
# `make test` runs four workers.
SHARED_GROUPS = {"runtime": "engines", "install": "install", "kube": "kube"}
KUBE_PARAMS = ("kube",)
"""A test parametrized with one of these (the runtime suite's ``kube`` backend) runs in the kube
group too: the cluster's node fits two sandbox pods at a time."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = os.path.dirname(__file__)
    for item in items:
        relative = os.path.relpath(str(item.path), root)
        group = SHARED_GROUPS.get(relative.split(os.sep, 1)[0], relative)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(value in KUBE_PARAMS for value in params.values() if isinstance(value, str)):
            group = "kube"
        item.add_marker(pytest.mark.xdist_group(name=group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run ungrouped: a pytest that xdist cannot group with would spread dockerd's
    tests over both workers, and one worker would stop it under the other."""
    if session.config.getoption("loadgroup", default=False) and session.items:
        if "@" not in session.items[0].nodeid:
            raise pytest.UsageError("pytest-xdist did not apply the xdist_group marks (pytest >= 9.2?)")
