"""One real bridge per test module (``kernelbridge serve`` over stdio, real podman sandboxes).

Every attack runs in a session of its own, so an attack that ends its sandbox costs only that
session; the sessions are closed when the module ends, and the suite-wide check in
``tests/conftest.py`` fails if any container is left behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from bridge_harness import Bridge, ensure_image, open_bridge


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the zmq sockets of jupyter_client (and the tunnel) are asyncio-only


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    return ensure_image()


@pytest.fixture(scope="module")
async def bridge(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> AsyncIterator[Bridge]:
    state = tmp_path_factory.mktemp("security") / "state"
    async with open_bridge(state, KERNELBRIDGE_MAX_SESSIONS="16", KERNELBRIDGE_WARM_POOL="1") as opened:
        yield opened
