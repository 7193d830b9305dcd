"""Suite-wide checks. Every sandbox a test starts must be gone when the suite ends."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import anyio
import pytest

from kernelbridge.config import load_settings
from kernelbridge.runtime import SESSION_LABEL, cli_runtime, pid_alive

# Containers end asynchronously (`--rm` after the agent exits); give them this long to go.
LEFTOVER_GRACE = 20.0


def leftover_containers() -> list[str]:
    """Sandbox containers whose owner is this test process or a process that no longer exists
    (a bridge started by a test). Containers of a developer's live bridge are not ours."""
    import os

    runtime = cli_runtime(load_settings())
    containers = anyio.run(runtime.list, {SESSION_LABEL: ""})
    return [
        c.name
        for c in containers
        if c.owner_pid is None or c.owner_pid == os.getpid() or not pid_alive(c.owner_pid)
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
