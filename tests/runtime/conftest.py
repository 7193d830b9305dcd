"""Fixtures of the runtime tests: the engines (started once per run, stopped after) and one
backend per test, parametrized over every backend this machine can run.

- ``podman_url``: the system podman socket when one answers, else a ``podman system service`` of
  this test run on a socket in a temp dir.
- ``docker_url``: ``DOCKER_HOST`` or ``/var/run/docker.sock`` when a dockerd answers there, else a
  dockerd of our own under ``/run/kernelbridge-test-docker`` (no bridge, no iptables, so the host's
  network is untouched), with the sandbox image copied in from podman's store. Stopped afterwards.
- ``backend``: a fresh backend per test (podman-api, docker-api, podman-cli, docker-cli, the
  local test double, and ``kube``: pods on the development cluster, ``kube_cluster``, skipped with
  one line when its binaries are not built); every container the test made (label
  ``kernelbridge.test-run=<pid>``) is removed afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_harness import SCRIPT
from runtime_harness import (
    DOCKER_DIR,
    TEST_RUN_LABEL,
    docker_has_image,
    load_image,
    ping,
    start_dockerd,
    start_podman_service,
)

from kernelbridge.config import Settings, load_settings
from kernelbridge.runtime.base import RuntimeBackend
from kernelbridge.runtime.cli.backend import CliRuntime
from kernelbridge.runtime.engine.api import open_engine
from kernelbridge.runtime.engine.endpoint import parse_endpoint
from kernelbridge.runtime.engine.transport import EngineClient
from kernelbridge.runtime.kube import open_kube
from kernelbridge.testing import LocalProcessRuntime

BACKENDS = ["podman-api", "docker-api", "podman-cli", "docker-cli", "local", "kube"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox_image() -> Iterator[str]:
    """The current sandbox image in podman's store, built once if missing or stale, and pinned
    for the run by a created (never started) container: an image build of another source tree
    on this machine removes the images of other agent hashes, except those a container uses."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    from kernelbridge.testing import ensure_sandbox_image

    tag = ensure_sandbox_image()
    pin = f"kbtest-pin-{os.getpid()}"
    label = f"{TEST_RUN_LABEL}={os.getpid()}"
    subprocess.run(
        ["podman", "create", "--name", pin, "--label", label, "--pull", "never", tag, "true"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rm", "-f", pin], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def podman_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "/nonexistent")
    for path in ("/run/podman/podman.sock", f"{runtime_dir}/podman/podman.sock"):
        if ping(f"unix://{path}"):
            yield f"unix://{path}"
            return
    # A short path: sun_path holds 107 bytes and pytest's temp dirs can be longer.
    run = Path(tempfile.mkdtemp(prefix="kbpod-"))
    url = f"unix://{run}/podman.sock"
    service = start_podman_service(url, tmp_path_factory.mktemp("podman") / "service.log")
    try:
        yield url
    finally:
        service.stop()
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_url(sandbox_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    candidates = [
        os.environ.get("DOCKER_HOST", ""),
        "unix:///var/run/docker.sock",
        f"unix://{DOCKER_DIR}/docker.sock",
    ]
    url = next((c for c in candidates if c.startswith("unix://") and ping(c)), None)
    daemon = None
    if url is None:
        if shutil.which("dockerd") is None:
            pytest.skip("dockerd is not installed (scripts/setup.sh installs docker.io)")
        if os.geteuid() != 0:
            pytest.skip("starting a dockerd for the tests needs root")
        url = f"unix://{DOCKER_DIR}/docker.sock"
        daemon = start_dockerd(DOCKER_DIR, [url])
    try:
        if not docker_has_image(url, sandbox_image):
            load_image(url, sandbox_image, tmp_path_factory.mktemp("image"))
        yield url
    finally:
        if daemon is not None:
            daemon.stop()


def kube_settings(request: pytest.FixtureRequest) -> Settings:
    """``KERNELBRIDGE_RUNTIME=kube`` on the development cluster; the image loader is its import
    (the ImageStore's writes are built locally and loaded onto the node, which is what the image
    tests test)."""
    cluster = request.getfixturevalue("kube_cluster")
    return load_settings(
        {
            "KERNELBRIDGE_RUNTIME": "kube",
            "KUBECONFIG": str(cluster.kubeconfig),
            "KERNELBRIDGE_KUBE_IMAGE_LOADER": f"{SCRIPT} import",
            "HOME": os.environ.get("HOME", "/root"),
        }
    )


def engine_url(request: pytest.FixtureRequest, name: str) -> str:
    return request.getfixturevalue("podman_url" if name.startswith("podman") else "docker_url")


KNOWN_GAPS = {
    ("test_oom_kill_is_reported", "podman-cli"): (
        "xfail",
        "podman 4.3 never sets OOMKilled with Debian's conmon (its 'oom' marker lands in conmon's "
        "working directory, podman looks in the bundle); the API backend infers it, the CLI does not yet",
    ),
}
"""(test, backend) pairs that fail for a known reason outside this suite: deterministic ones are
strict xfails (a fix is noticed), racy ones are skipped (they would hang until the step's bound)."""


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, sandbox_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[RuntimeBackend]:
    """Every backend in turn; absent ones are skipped with the reason."""
    name: str = request.param
    kind, reason = KNOWN_GAPS.get((request.node.originalname, name), ("", ""))
    if kind == "skip":
        pytest.skip(f"known gap: {reason}")
    if kind == "xfail":
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    async with contextlib.AsyncExitStack() as stack:
        runtime: Any
        if name.endswith("-api"):
            url = engine_url(request, name)
            runtime = await open_engine(EngineClient(parse_endpoint(url), engine=name.removesuffix("-api")))
            stack.push_async_callback(runtime.aclose)
        elif name == "local":
            runtime = await stack.enter_async_context(LocalProcessRuntime())
        elif name == "kube":
            runtime = await stack.enter_async_context(await open_kube(kube_settings(request)))
        else:
            engine = name.removesuffix("-cli")
            executable = shutil.which(engine)
            if executable is None:
                pytest.skip(f"{engine} is not installed")
            if engine == "docker":
                # The docker CLI finds the engine the way users point it: DOCKER_HOST.
                monkeypatch.setenv("DOCKER_HOST", engine_url(request, name))
            # In a directory of the test's own: conmon drops an 'oom' marker into the CLI's working
            # directory after an OOM kill (it was the repository root, whose `oom` got committed).
            cli = CliRuntime(engine=engine, executable=executable, workdir=tmp_path / "cli")
            runtime = await stack.enter_async_context(cli)
        try:
            yield runtime
        finally:
            leftovers = await runtime.list({TEST_RUN_LABEL: str(os.getpid())})
            await runtime.remove([c.id for c in leftovers])
