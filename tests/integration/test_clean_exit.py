"""No unrecorded sandbox outlives a clean exit: a client that connects and leaves at once, while
the warm pool is creating its first sandbox, leaves no container behind that no record names
(issue 18: one was left in `Created`).

The window is the warm sandbox's create: cancelled half-way, the engine had made the container
but the bridge never learnt its id. Each exit here comes at another moment of that start (right
after initialize, a little later, once it is ready). A warm sandbox that was ready is durable (the
default): it is detached and recorded in the state directory for the next bridge's pool
(`kernelbridge sessions` lists it). After each exit the test's own label matches nothing else:
none half-created, none exited, none running that no record keeps.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import anyio
import pytest
from bridge_harness import serve_params, serve_pids
from mcp.client.client import Client

from kernelbridge.config import load_settings
from kernelbridge.runtime import ContainerState, cli_runtime
from kernelbridge.session.store import SessionStore

pytestmark = [pytest.mark.podman, pytest.mark.slow]


def containers_labelled(key: str, value: str) -> list[str]:
    runtime = cli_runtime(load_settings())
    return [f"{c.name} ({c.state})" for c in anyio.run(runtime.list, {key: value})]


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5, 3.0])
def test_leaving_while_the_warm_pool_starts_leaves_no_container(
    tmp_path: Path, sandbox_image: str, delay: float
) -> None:
    mark = uuid.uuid4().hex[:12]
    labels = f"{os.environ['KERNELBRIDGE_LABELS']},kbtest.exit={mark}"
    state = tmp_path / "state"

    async def connect_and_leave() -> None:
        params = serve_params(state, KERNELBRIDGE_LABELS=labels)
        with anyio.fail_after(60):
            async with Client(params, read_timeout_seconds=60):
                await anyio.sleep(delay)

    anyio.run(connect_and_leave)
    assert serve_pids(state) == []
    # The bridge removed or recorded what it made before it exited: nothing to wait for.
    kept = {f"{record.container} ({ContainerState.RUNNING})" for record in SessionStore(state).warm_records()}
    left = containers_labelled("kbtest.exit", mark)
    assert set(left) <= kept, (left, kept)
    assert len(left) <= 1, left
