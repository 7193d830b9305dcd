"""Shared fixtures for the server's integration tests: a real MCP client over stdio.

``mcp_client`` spawns ``.venv/bin/kernelbridge serve`` (the console script, exactly as an MCP host
would) with its state in ``tmp_path``, so every test gets its own sessions, journals and
containers, and leaves none behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
CLIENT_TIMEOUT = 120.0
"""Bound on any single MCP request in these tests (a cold sandbox start is ~1 s)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # jupyter_client's zmq sockets are asyncio-only


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The current sandbox image, built once if missing or stale (about two minutes)."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    from kernelbridge import image
    from kernelbridge.config import load_settings
    from kernelbridge.testing import ensure_sandbox_image

    # The image of the configured extra packages, if any (the bridges the tests start expect it).
    extras = image.extras_from_settings(load_settings())
    return ensure_sandbox_image(extras=extras)


def serve_params(state_dir: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(KERNELBRIDGE),
        args=["serve"],
        env={
            "KERNELBRIDGE_STATE_DIR": str(state_dir),
            "KERNELBRIDGE_LABELS": os.environ["KERNELBRIDGE_LABELS"],
            # The suite run as an unprivileged user on cgroup v1 (tests/install) allows unlimited
            # sandboxes; the MCP client passes only a few variables on by itself.
            **{k: v for k, v in os.environ.items() if k in PASSED_ON},
            **env,
        },
        cwd=str(REPO),
    )


PASSED_ON = ("KERNELBRIDGE_ALLOW_UNLIMITED", "KERNELBRIDGE_IMAGE_PACKAGES", "PYTHONPATH")
"""Variables of the test process that the spawned bridges get too."""

ClientFactory = Callable[..., AbstractAsyncContextManager[Client]]


@pytest.fixture
def connect(tmp_path: Path, sandbox_image: str) -> ClientFactory:
    """``async with connect(**env) as client``: a fresh ``kernelbridge serve`` over stdio."""

    @asynccontextmanager
    async def open_client(state_dir: Path | None = None, **env: str) -> AsyncIterator[Client]:
        params = serve_params(state_dir or tmp_path / "state", **env)
        async with Client(params, read_timeout_seconds=CLIENT_TIMEOUT) as client:
            yield client

    return open_client


@pytest.fixture
async def mcp_client(connect: ClientFactory) -> AsyncIterator[Client]:
    async with connect() as client:
        yield client


def list_containers() -> list[str]:
    """Names of kernelbridge sandbox containers (running or not)."""
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", "label=kernelbridge.session", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return out.split()


def serve_pids(state_dir: Path) -> list[int]:
    """PIDs of ``kernelbridge serve`` processes using ``state_dir`` (found via /proc environ)."""
    marker = f"KERNELBRIDGE_STATE_DIR={state_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and b"serve" in cmdline.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def peak_rss_kib(pid: int) -> int:
    """The peak resident set size of ``pid`` (VmHWM): catches a spike between two samples."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


class ServerTools:
    """Helpers for server tests, handed out as the ``kb`` fixture (conftest is not importable)."""

    containers = staticmethod(list_containers)
    serve_pids = staticmethod(serve_pids)
    rss_kib = staticmethod(rss_kib)
    peak_rss_kib = staticmethod(peak_rss_kib)
    text_of = staticmethod(text_of)

    @staticmethod
    async def run(client: Client, code: str, **args: Any) -> Any:
        return await client.call_tool("run_python", {"code": code, **args})


@pytest.fixture
def kb() -> type[ServerTools]:
    return ServerTools
