"""A warm ``run_python`` of this checkout beside the same call of another source tree, in one run:

    git worktree add /tmp/base HEAD~1
    PYTHONPATH=/tmp/base .venv/bin/kernelbridge image build   # that tree's own sandbox image
    .venv/bin/python bench/bench_compare.py --base /tmp/base [--calls 1600]

Two bridges run at once (the base one with ``PYTHONPATH`` set to its tree, so this venv's packages
serve both), each with a session already warm. Calls go in blocks of 100, the two taking turns to
go first, and only one bridge is busy at a time. So a block's whole-machine CPU time (``/proc/stat``)
is that variant's: the bridge's, its engine service's, conmon's, the agent's and the kernel's. This
VM's speed varies by half within an hour; measured apart, a 5% change is lost in that drift.

What it is for: a change to the hot path, judged by its cost and not only its latency. Printed per
variant: the median call, the bridge's CPU time and the machine's per call, then new/base ratios.
Never fails on timing.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from bench_runtime import bridge, call, warm_calls  # same directory: the same calls as its warm measure
from mcp.client.client import Client

BLOCK = 100
WARM_UP = 30
TICKS = 100
"""Clock ticks per second of ``/proc`` CPU times (``getconf CLK_TCK``: 100 on Linux)."""


@dataclass
class Variant:
    name: str
    client: Client
    pid: int
    times: list[float] = field(default_factory=list)
    bridge_ticks: int = 0
    machine_ticks: int = 0

    def report(self) -> tuple[float, float, float]:
        calls = len(self.times)
        return (
            statistics.median(self.times) * 1000,
            self.bridge_ticks / TICKS / calls * 1000,
            self.machine_ticks / TICKS / calls * 1000,
        )


def process_ticks(pid: int) -> int:
    """utime + stime of ``pid``, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def machine_ticks() -> int:
    """Busy time of every CPU (not idle, not iowait), in clock ticks."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4]


def bridge_pid(before: set[int]) -> int:
    """The ``kernelbridge serve`` process that was not there before."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in before:
            try:
                if b"kernelbridge\0serve" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise RuntimeError("the bridge's process was not found")


def pids() -> set[int]:
    return {int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()}


async def start(stack: AsyncExitStack, name: str, source: str | None) -> Variant:
    """A bridge of this checkout (``source`` None) or of ``source``, its session warm."""
    before = pids()
    # bench_runtime's bridge: a throwaway state directory, no durable sessions.
    client, _ = await stack.enter_async_context(bridge(None, **({"PYTHONPATH": source} if source else {})))
    await warm_calls(client, WARM_UP)
    return Variant(name, client, bridge_pid(before))


async def compare(base: str, calls: int) -> None:
    async with AsyncExitStack() as stack:
        new = await start(stack, "new", None)
        old = await start(stack, "base", base)
        for block in range(max(calls // BLOCK, 2)):
            for variant in (new, old) if block % 2 else (old, new):
                bridge, machine = process_ticks(variant.pid), machine_ticks()
                for _ in range(BLOCK):
                    variant.times.append(await call(variant.client, "1+1"))
                variant.bridge_ticks += process_ticks(variant.pid) - bridge
                variant.machine_ticks += machine_ticks() - machine
        print(f"warm `run_python` of `1+1`, {len(new.times)} calls each, in blocks of {BLOCK}:")
        print(f"  {'':8} {'median ms':>10} {'bridge CPU ms':>14} {'machine CPU ms':>15}")
        reports = {}
        for variant in (old, new):
            reports[variant.name] = variant.report()
            median, bridge, machine = reports[variant.name]
            print(f"  {variant.name:8} {median:10.2f} {bridge:14.3f} {machine:15.3f}")
        ratios = [n / b for n, b in zip(reports["new"], reports["base"], strict=True)]
        print(f"  {'new/base':8} {ratios[0]:9.3f}x {ratios[1]:13.3f}x {ratios[2]:14.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other source tree (a git worktree)")
    parser.add_argument("--calls", type=int, default=1600, help="measured calls per variant")
    args = parser.parse_args()
    if not (Path(args.base) / "kernelbridge" / "__init__.py").is_file():
        parser.error(f"{args.base} is not a kernelbridge source tree")
    anyio.run(compare, str(Path(args.base).resolve()), args.calls)


if __name__ == "__main__":
    main()
