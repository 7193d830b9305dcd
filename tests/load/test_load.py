"""Load through one bridge (stdio, real sandboxes): many sessions calling at once. Every output
must come back with its own call (no misrouting), the bridge's memory must stay bounded, and
closing the sessions must leave no container behind. ``--soak`` runs a much longer version."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from bridge_harness import Bridge, open_bridge, reset_peak
from engine_probe import container_exists
from scale import soak_or

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

MiB = 1024
SESSIONS = 10
CALLS = soak_or(30, 100)
"""Calls each session makes, every output checked at its own call: 30 (300 in all); 100 with ``--soak``."""
PEAK_BOUND = 300 * MiB
"""Bridge peak growth allowed under load: honest cells hold little; far below the hostile bound."""

CELL = """
import random
token = {token!r}
print(token)
blob = "z" * random.randint(0, 200_000)  # outputs of varied size
print(len(blob))
token
"""


async def load(bridge: Bridge, sessions: int, calls: int, *, flood_every: int = 0) -> dict[str, float]:
    errors: list[str] = []
    latencies: list[float] = []

    async def one_session(n: int) -> None:
        session = f"load-{n}"
        for i in range(calls):
            token = f"{session}:{i}"
            code = CELL.format(token=token)
            if flood_every and i % flood_every == 0:
                code += "\nprint('x' * 5_000_000)"
            result = await bridge.run(code, session)
            latencies.append(result.seconds)
            lines = result.stdout.splitlines()
            if (
                result.status != "ok"
                or not lines
                or lines[0] != token
                or result.data["result"] != repr(token)
            ):
                errors.append(f"{token}: {result.status} {result.stdout[:200]!r}")

    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for n in range(sessions):
            tg.start_soon(one_session, n)
    assert not errors, errors[:5]
    latencies.sort()
    return {
        "seconds": time.monotonic() - start,
        "median_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
    }


async def run_and_check(tmp_path: Path, sessions: int, calls: int, flood_every: int = 0) -> None:
    env = {"KERNELBRIDGE_MAX_SESSIONS": str(sessions), "KERNELBRIDGE_WARM_POOL": "2"}
    async with open_bridge(tmp_path / "state", **env) as bridge:
        await bridge.run("1", "warmup")
        await bridge.close("warmup")
        before = bridge.rss_kib()
        reset_peak(bridge.pid)
        figures = await load(bridge, sessions, calls, flood_every=flood_every)
        peak = bridge.peak_kib() - before
        containers = [s["container"] for s in (await bridge.listed()).values()]
        print(
            f"\nload {sessions}x{calls}: {figures['seconds']:.1f} s, median {figures['median_ms']:.1f} ms, "
            f"p99 {figures['p99_ms']:.1f} ms, bridge RSS {before // MiB} MiB, peak +{peak // MiB} MiB"
        )
        assert peak < PEAK_BOUND, peak
        for n in range(sessions):
            await bridge.close(f"load-{n}")
    for container in containers:  # closing removed them before it answered
        assert not container_exists(container), container


async def test_ten_sessions_calling_at_once(tmp_path: Path, sandbox_image: str) -> None:
    await run_and_check(tmp_path, SESSIONS, CALLS)


@pytest.mark.soak
async def test_soak(tmp_path: Path, sandbox_image: str) -> None:
    # About 20 minutes on 2 cores: 10 sessions x 2,000 calls, every 50th printing 5 MB.
    await run_and_check(tmp_path, SESSIONS, 2000, flood_every=50)
