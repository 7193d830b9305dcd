"""Many sandboxes started at once, with their starts taking turns (kernelbridge/host/admission.py)
a few at a time, or all at once, side by side in one run:

    .venv/bin/python bench/bench_start_turns.py [--sandboxes 20] [--slots 2,4,8,0]

For each number of slots (0: every start at once, as before turns), N sandboxes are started
together on the engine the bridge would pick; printed: until all are ready, and the longest
single start measured from its turn (what its bound, KERNELBRIDGE_KERNEL_START_TIMEOUT, counts)
and from its request (what the session waits). Run it beside `scripts/under-load` for a machine
busy with something else. Never fails on timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import anyio

from kernelbridge.config import load_settings
from kernelbridge.host import Sandbox, SandboxHandlers, expected_image
from kernelbridge.host.admission import StartAdmission
from kernelbridge.runtime import RuntimeBackend, open_selection


async def burst(
    runtime: RuntimeBackend, state: str, sandboxes: int, slots: int
) -> tuple[float, float, float]:
    settings = load_settings({**os.environ, "KERNELBRIDGE_STATE_DIR": state})
    image, agent_hash = expected_image(settings)
    admission = StartAdmission(Path(state) / "slots", slots=slots or sandboxes, queue_timeout=600)
    from_turn: list[float] = []
    from_request: list[float] = []
    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        started: list[Sandbox] = []

        async def start(i: int) -> None:
            asked = time.perf_counter()
            async with admission.turn(f"burst{i}"):
                turn = time.perf_counter()
                sandbox = Sandbox.create(settings, runtime, f"burst{i}", image=image, agent_hash=agent_hash)
                await tg.start(partial(sandbox.run, SandboxHandlers()))
            done = time.perf_counter()
            from_turn.append(done - turn)
            from_request.append(done - asked)
            started.append(sandbox)

        async with anyio.create_task_group() as starts:
            for i in range(sandboxes):
                starts.start_soon(start, i)
        all_ready = time.perf_counter() - began
        async with anyio.create_task_group() as closing:
            for sandbox in started:
                closing.start_soon(sandbox.close)
    return all_ready, max(from_turn), max(from_request)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as state:
        settings = load_settings({**os.environ, "KERNELBRIDGE_STATE_DIR": state, "KERNELBRIDGE_DURABLE": "0"})
        async with open_selection(settings) as selection:
            print(f"runtime: {selection.reason}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
            print("| slots | all ready | longest start from its turn | longest from its request |")
            print("|---|---|---|---|")
            for slots in args.slots:
                ready, turn, request = await burst(selection.backend, state, args.sandboxes, slots)
                label = str(slots) if slots else f"{args.sandboxes} (all at once)"
                print(f"| {label} | {ready:.1f} s | {turn:.1f} s | {request:.1f} s |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=int, default=20)
    parser.add_argument("--slots", type=lambda text: [int(n) for n in text.split(",")], default=[2, 4, 8, 0])
    sys.exit(anyio.run(main, parser.parse_args()))
