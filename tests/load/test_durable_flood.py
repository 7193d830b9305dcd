"""Detached sandboxes flooding their buffer, adopted all at once by one new bridge (issue 23), with
real podman sandboxes: the bridge's memory stays bounded, every session is adopted with its state,
and each first result says truthfully what was dropped.

Each sandbox's kernel code arms a thread that, once its bridge has gone (the test touches a file
in it then), publishes ``2 x KERNELBRIDGE_DETACHED_BUFFER`` of output straight onto iopub (past
the kernel's own output cap, as hostile code can), then goes on with a trickle while the next
bridge adopts it. The agent keeps its buffer's worth (32 MiB by default) for that bridge, which
takes all of them at start. The bridge must not hold what the sandboxes resend: its peak resident
size, beside a bridge that adopted nothing, stays under half of what they resend together.

A few sessions by default; the 50 of ``tests/load/test_durable_load.py`` with ``--soak``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge, podman
from durable_harness import DURABLE, remove_sandboxes_of, running, wait_for, workspace_files

from kernelbridge.config import Settings

pytestmark = pytest.mark.anyio

MiB = 1024  # KiB per MiB: /proc figures are in KiB
BUFFER = Settings(state_dir=Path("unused")).detached_buffer
"""The detached buffer at its default: what each sandbox holds and resends."""
ARM = """
import os, threading, time
kernel = get_ipython().kernel
parent = kernel.get_parent("shell")
def publish(size):
    content = {{"name": "stdout", "text": "f" * size}}
    kernel.session.send(kernel.iopub_socket, "stream", content, parent=parent)
def flood():
    deadline = time.monotonic() + 600  # bounded, whatever the test does
    while not os.path.exists("/workspace/go") and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range({chunks}):
        publish(1 << 20)
    open("/workspace/flooded", "w").close()
    while not os.path.exists("/workspace/stop") and time.monotonic() < deadline:
        publish(64 << 10)
        time.sleep(0.1)
threading.Thread(target=flood, daemon=True).start()
print("armed")
"""


@pytest.fixture
def state(tmp_path: Path, sandbox_image: str) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    remove_sandboxes_of(state_dir)


def flooded(container: str) -> bool:
    return "flooded" in workspace_files(container)


async def adopt_flooding(state: Path, tmp_path: Path, sessions: int) -> None:
    env = {**DURABLE, "KERNELBRIDGE_MAX_SESSIONS": str(max(8, sessions))}
    names = [f"s{i}" for i in range(sessions)]
    arm = ARM.format(chunks=2 * BUFFER // (1 << 20))
    async with open_bridge(state, **env) as bridge:
        for name in names:
            armed = await bridge.run(f"mine = {name!r}\n" + arm, name)
            assert armed.status == "ok" and armed.stdout == "armed\n", armed.text
        containers = [await bridge.container(name) for name in names]
    await wait_for(lambda: running(*containers), "every sandbox runs on")
    for container in containers:
        podman("exec", container, "touch", "/workspace/go")
    await wait_for(lambda: all(map(flooded, containers)), "every flood was published", timeout=300)

    async with open_bridge(tmp_path / "empty", **env) as idle:  # the same bridge, adopting nothing
        await idle.listed()
        baseline = idle.peak_kib()
    async with open_bridge(state, **env) as bridge:
        seen: dict[str, tuple[str, bool, bool]] = {}

        async def first(name: str) -> None:
            result = await bridge.run("open('/workspace/stop', 'w').close()\nprint(mine)", name)
            dropped = "dropped while no bridge was attached" in result.notes
            seen[name] = (result.stdout, "adopted" in result.codes, dropped)

        with anyio.fail_after(600):
            async with anyio.create_task_group() as tg:
                for name in names:
                    tg.start_soon(first, name)
        peak = bridge.peak_kib() - baseline
        print(f"\n{sessions} flooding sandboxes adopted at once: peak +{peak // MiB} MiB over an idle bridge")
        assert seen == {name: (f"{name}\n", True, True) for name in names}, seen
        # Holding half of what they resent would be this much: the bridge holds far less.
        assert peak < sessions * BUFFER // 2 // 1024, peak
        for name in names:
            await bridge.close(name)


async def test_a_few_flooding_sandboxes_adopted_at_once(state: Path, tmp_path: Path) -> None:
    await adopt_flooding(state, tmp_path, 4)


@pytest.mark.soak
async def test_fifty_flooding_sandboxes_adopted_at_once(state: Path, tmp_path: Path) -> None:
    await adopt_flooding(state, tmp_path, 50)
