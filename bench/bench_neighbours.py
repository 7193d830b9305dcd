"""What a CPU hog in one session costs a calm session of the same bridge.

    .venv/bin/python bench/bench_neighbours.py [--rounds N]

Starts ``kernelbridge serve`` (stdio, default settings) with two sessions. The hog's session
starts four busy processes (tests/peers/hostile_cells.py's ``HOG``, the security suite's attack);
the calm session's warm ``1+1`` is timed in interleaved rounds with the hogs stopped (SIGSTOP) and
running (SIGCONT), so that the machine's other load weighs on both sides alike. Prints the hogs'
CPU share (the sandbox's limit, ``KERNELBRIDGE_CPUS``, default 1) and the two medians with their
ratio. Needs the sandbox image. Fails on nothing: tests/security/test_resources.py checks the
limit and that the calm session is served.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the suite's harness and attacks
from bridge_harness import Bridge, ensure_image, open_bridge, podman
from peers.hostile_cells import HOG, HOG_SHARE, HOGS_OFF, HOGS_ON

LABEL = "kernelbridge.bench=neighbours"
CALLS_PER_ROUND = 10


async def warm_latencies(bridge: Bridge, session: str, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        result = await bridge.run("1 + 1", session)
        if result.status != "ok":
            raise SystemExit(f"the calm session failed: {result.text}")
        times.append(result.seconds)
    return times


async def measure(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with open_bridge(Path(tmp) / "state") as bridge:
            calm, hog = "calm", "hog"
            await bridge.run("1", calm)
            print((await bridge.run(HOG, hog)).stdout.strip())
            sampled = await bridge.run(HOG_SHARE, hog, timeout=30)
            if sampled.status != "ok":
                raise SystemExit(f"the hogs' share was not measured: {sampled.text}")
            share = sampled.data["result"]
            quiet: list[float] = []
            busy: list[float] = []
            for _ in range(rounds):
                await bridge.run(HOGS_OFF, hog)
                quiet += await warm_latencies(bridge, calm, CALLS_PER_ROUND)
                await bridge.run(HOGS_ON, hog)
                busy += await warm_latencies(bridge, calm, CALLS_PER_ROUND)
            await bridge.close(hog)
            await bridge.close(calm)
    if left := podman("ps", "-aq", "--filter", f"label={LABEL}").split():  # the warm pool's, durable
        podman("rm", "-f", "-t", "0", *left)
    before, during = statistics.median(quiet) * 1000, statistics.median(busy) * 1000
    print(f"the hogs' CPU share: {share} CPUs (the limit: 1)")
    print(
        f"calm session's warm 1+1: {before:.1f} ms with the hogs stopped, {during:.1f} ms with them"
        f" running = {during / before:.2f}x ({len(quiet)} calls each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()
    os.environ.setdefault("KERNELBRIDGE_LABELS", LABEL)  # the harness passes it on to every sandbox
    ensure_image()
    anyio.run(measure, args.rounds)


if __name__ == "__main__":
    main()
