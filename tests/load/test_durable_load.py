"""50 detached sessions adopted by one new bridge (issue 15), with real podman sandboxes: a soak
(``--soak``), as 50 sandboxes take a minute to start on 2 cores and ~3 GiB of memory.

One bridge makes the sessions, each with a variable of its own, and exits (every sandbox runs on,
detached); with no bridge no kernelbridge process serves them; a new bridge adopts them all (at
start, in the background) and each first call finds its own variable, said ``adopted``.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge, podman

from kernelbridge.host.container import STATE_LABEL, state_identity

pytestmark = pytest.mark.anyio

SESSIONS = 50
ENV = {"KERNELBRIDGE_MAX_SESSIONS": "64"}  # fifty sessions, in one namespace


def running(state: Path) -> list[str]:
    return podman("ps", "-q", "--filter", f"label={STATE_LABEL}={state_identity(state)}").split()


def processes_of(state: Path) -> int:
    """Processes on the host that serve ``state`` (its bridges and anything they started)."""
    marker = f"KERNELBRIDGE_STATE_DIR={state}".encode()
    found = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found += marker in (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
    return found


@pytest.mark.soak
async def test_fifty_detached_sessions_adopted_by_one_new_bridge(tmp_path: Path, sandbox_image: str) -> None:
    state = tmp_path / "state"
    names = [f"s{i}" for i in range(SESSIONS)]
    try:
        async with open_bridge(state, **ENV) as bridge:
            for name in names:
                assert (await bridge.run(f"mine = {name!r}", name)).status == "ok"
        assert len(running(state)) == SESSIONS
        assert processes_of(state) == 0  # no host process of ours per detached sandbox
        async with open_bridge(state, **ENV) as bridge:
            seen: dict[str, list[str]] = {}

            async def first(name: str) -> None:
                result = await bridge.run("print(mine)", name)
                seen[name] = [result.stdout, *result.codes]

            with anyio.fail_after(300):
                async with anyio.create_task_group() as tg:
                    for name in names:
                        tg.start_soon(first, name)
            assert seen == {name: [f"{name}\n", "adopted"] for name in names}
            for name in names:
                await bridge.close(name)
        assert running(state) == []
    finally:
        if left := podman("ps", "-aq", "--filter", f"label={STATE_LABEL}={state_identity(state)}").split():
            podman("rm", "-f", "-t", "0", *left, timeout=300)
