"""Issue 15's measurements: sessions that outlive their bridge, adopted by the next one.

    .venv/bin/python bench/bench_durable.py [--sessions 50] [--rounds 5]

Real bridges (``kernelbridge serve`` over stdio, ``KERNELBRIDGE_DURABLE=1``, the engine API backend)
and real podman sandboxes, in one run:

- **adopted first call vs warm call**: a session sets ``x``; its client exits (the bridge lets go
  of the sandbox); a new client's first call ``print(x)`` against the median warm call on that
  session afterwards (target <= 2x, state kept, no kernel start). The new bridge adopts at start
  (an exec, the challenge, the journal resumed) before it answers ``initialize`` (bounded by
  ``ADOPTION_WAIT``), so this is measured twice: the first call sent at once after ``initialize``,
  and 1 s later (a person typing their first question); beside it, what that costs the client's
  start (spawn to ``initialize`` answered) against a start on an empty state directory.
  ``--rounds`` of each, the median ratio;
- **first call with an adopted warm pool**: a bridge fills its warm pool of one and exits; a new
  bridge starts and its first call on a new session takes the adopted warm sandbox (target
  <= 50 ms, the time of the call after the bridge answered ``initialize``);
- **50 detached sessions adopted**: one bridge makes ``--sessions`` sessions and exits; with no
  bridge, the host processes per detached sandbox (the engine API: none of kernelbridge's own;
  conmon, the engine's monitor, is counted apart); then a new bridge's first call on each of
  them, all at once: the total time, each adopted with ``x`` kept.

Prints one line per figure and the ratios; fails on nothing. Sandboxes are closed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("KERNELBRIDGE_LABELS", "kernelbridge.bench=durable")
from bridge_harness import Bridge, ensure_image, open_bridge

from kernelbridge.host.container import STATE_LABEL, state_identity

DURABLE = {"KERNELBRIDGE_DURABLE": "1", "KERNELBRIDGE_WARM_POOL": "0", "KERNELBRIDGE_MAX_SESSIONS": "64"}


def running(state: Path) -> list[str]:
    out = subprocess.run(
        ["podman", "ps", "-q", "--no-trunc", "--filter", f"label={STATE_LABEL}={state_identity(state)}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def host_processes_of(state: Path, containers: list[str]) -> tuple[int, int]:
    """(kernelbridge processes of ``state``'s bridges, conmon processes of ``containers``) on the
    host (other bridges on the machine, with other state directories, are not counted)."""
    ours = conmon = 0
    marker = f"KERNELBRIDGE_STATE_DIR={state}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kernelbridge" in cmdline and marker in environ:
            ours += 1
        if b"conmon" in cmdline[:40] and any(c.encode() in cmdline for c in containers):
            conmon += 1
    return ours, conmon


async def warm_median(bridge: Bridge, session: str, n: int = 7) -> float:
    times = []
    for _ in range(n):
        result = await bridge.run("print(x)", session)
        assert result.status == "ok", result.text
        times.append(result.seconds)
    return statistics.median(times)


async def adopted_vs_warm(root: Path, rounds: int, pause: float) -> None:
    ratios, firsts, warms, restarts, empties = [], [], [], [], []
    for i in range(rounds):
        state = root / f"adopt-{i}-{pause}"
        async with open_bridge(state, **DURABLE) as bridge:
            assert (await bridge.run("x = 42", "s")).status == "ok"
        began = time.monotonic()
        async with open_bridge(root / f"empty-{i}-{pause}", **DURABLE):
            empties.append(time.monotonic() - began)
        began = time.monotonic()
        async with open_bridge(state, **DURABLE) as bridge:
            restarts.append(time.monotonic() - began)
            await anyio.sleep(pause)
            first = await bridge.run("print(x)", "s")
            assert first.stdout == "42\n" and "adopted" in first.codes, first.text
            warm = await warm_median(bridge, "s")
            await bridge.close("s")
        firsts.append(first.seconds)
        warms.append(warm)
        ratios.append(first.seconds / warm)
    when = "at once after initialize" if not pause else f"{pause:g} s after initialize"
    print(
        f"adopted first call ({when}): median {statistics.median(firsts) * 1000:.0f} ms; warm call: median "
        f"{statistics.median(warms) * 1000:.0f} ms; ratio {statistics.median(ratios):.2f}x "
        f"(target <= 2x; {rounds} rounds, state kept); the client's start (spawn to initialize answered): "
        f"median {statistics.median(restarts) * 1000:.0f} ms with the session to adopt, "
        f"{statistics.median(empties) * 1000:.0f} ms on an empty state directory"
    )


async def adopted_warm_pool(root: Path, rounds: int) -> None:
    firsts = []
    env = {**DURABLE, "KERNELBRIDGE_WARM_POOL": "1"}
    for i in range(rounds):
        state = root / f"warm-{i}"
        async with open_bridge(state, **env):
            deadline = time.monotonic() + 60
            while not list((state / "warm").glob("*.json")):  # the pool's sandbox is ready
                assert time.monotonic() < deadline, "the warm pool did not fill"
                await anyio.sleep(0.05)
        async with open_bridge(state, **env) as bridge:
            first = await bridge.run("print('warm')", "s")
            assert first.status == "ok", first.text
            firsts.append(first.seconds)
            await bridge.close("s")
    print(
        f"first call of a new session right after a bridge started with an adopted warm pool: "
        f"median {statistics.median(firsts) * 1000:.0f} ms (target <= 50 ms; {rounds} rounds)"
    )


async def many_adopted(root: Path, sessions: int) -> None:
    state = root / "many"
    names = [f"s{i}" for i in range(sessions)]
    async with open_bridge(state, **DURABLE) as bridge:
        for name in names:
            result = await bridge.run(f"x = {name!r}", name)
            assert result.status == "ok", result.text
    detached = running(state)
    ours, conmon = host_processes_of(state, detached)
    print(
        f"{len(detached)} detached sandboxes with no bridge: {ours} kernelbridge processes of this state "
        f"directory ({ours / max(len(detached), 1):.2f} per detached sandbox; target 0), {conmon} conmon "
        "(the engine's own monitor, one per container whatever kernelbridge does)"
    )
    spawned = time.monotonic()
    async with open_bridge(state, **DURABLE) as bridge:
        initialized = time.monotonic() - spawned  # the adoption at start happens before this
        started = time.monotonic()
        adopted = 0

        async def first(name: str) -> None:
            nonlocal adopted
            result = await bridge.run("print(x)", name)
            assert result.stdout == f"{name}\n" and "adopted" in result.codes, result.text
            adopted += 1

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(first, name)
        took = time.monotonic() - started
        whole = time.monotonic() - spawned
        rss = bridge.rss_kib()
        print(
            f"{adopted} detached sessions adopted by one new bridge: initialize answered {initialized:.1f} s "
            f"after its spawn, then their first calls all at once {took:.1f} s; {whole:.1f} s in all "
            f"({whole / sessions * 1000:.0f} ms per session); the bridge's RSS then {rss / 1024:.0f} MiB"
        )
        for name in names:
            await bridge.close(name)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["adopted", "warm", "many"], help="one of the three measurements")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-durable-") as tmp:
        root = Path(tmp)
        if args.only in (None, "adopted"):
            await adopted_vs_warm(root, args.rounds, 0.0)  # the call waits for the adoption begun at start
            await adopted_vs_warm(root, args.rounds, 1.0)  # a person typing: adopted by then
        if args.only in (None, "warm"):
            await adopted_warm_pool(root, args.rounds)
        if args.only in (None, "many"):
            await many_adopted(root, args.sessions)


if __name__ == "__main__":
    ensure_image()
    anyio.run(main)
