"""Shared fixtures for the server's integration tests: a real MCP client over stdio.

``mcp_client`` spawns ``.venv/bin/kernelbridge serve`` (the console script, exactly as an MCP host
would; ``bridge_harness.serve_params``) with its state in ``tmp_path``, so every test gets its own
sessions, journals and containers, and leaves none behind. ``shared_client`` is the module's one
bridge instead (every setting at its default), whose sessions are all closed after each test: for
tests that need a bridge with no sessions, not a bridge process of their own. ``host`` is a
module's host MCP set-up, ``jupyter_env`` a kernelspec for plain Jupyter clients. ``anyio_backend`` and
``sandbox_image`` are the suite-wide ones (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import (
    Bridge,
    list_containers,
    open_bridge,
    peak_rss_kib,
    rss_kib,
    serve_params,
    serve_pids,
    text_of,
)
from mcp.client.client import Client
from peers.host_bridge import HostConfig, host_with_remote_edge, peers_missing

from kernelbridge.jupyter import install_kernelspec

CLIENT_TIMEOUT = 120.0
"""Bound on any single MCP request in these tests (a cold sandbox start is ~1 s)."""

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


@pytest.fixture(scope="module")
async def shared_bridge(
    tmp_path_factory: pytest.TempPathFactory, sandbox_image: str
) -> AsyncIterator[Bridge]:
    """The module's one ``kernelbridge serve`` over stdio, every setting at its default."""
    async with open_bridge(tmp_path_factory.mktemp("shared") / "state") as bridge:
        yield bridge


@pytest.fixture
async def shared_client(shared_bridge: Bridge) -> AsyncIterator[Client]:
    """The module's bridge, with no session open when the test begins or after it ends (each one
    it opened is closed, its sandbox with it; the warm pool stays, as a user's bridge keeps it)."""
    yield shared_bridge.client
    for session in await shared_bridge.listed():
        await shared_bridge.close(session)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> Iterator[HostConfig]:
    """A user's host MCP set-up (``peers.host_bridge``) with the remote edge server running, for
    the module's bridge; skips when the test peers are not installed."""
    if why := peers_missing():
        pytest.skip(why)
    with host_with_remote_edge(tmp_path_factory.mktemp("host")) as config:
        yield config


@pytest.fixture
def jupyter_env(tmp_path: Path, sandbox_image: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The ``kernelbridge`` kernelspec installed in a prefix of ``tmp_path``, and the environment
    (``JUPYTER_PATH``, the state directory) and working directory a Jupyter client there has."""
    install_kernelspec(prefix=str(tmp_path / "prefix"))
    env = {
        "JUPYTER_PATH": str(tmp_path / "prefix" / "share" / "jupyter"),
        "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # Managers resolve a relative connection_dir against the working directory: make it ours.
    monkeypatch.chdir(tmp_path)
    return env


class ServerTools:
    """Helpers for server tests, handed out as the ``kb`` fixture."""

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
