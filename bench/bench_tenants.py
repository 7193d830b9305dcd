"""Issue 13's measurements: what one hostile tenant costs the host and the other tenants.

    .venv/bin/python bench/bench_tenants.py [--source DIR] [--quick]

Starts ``kernelbridge serve --http`` with two tokens (alice, bob) and measures, in one run:

- **journal growth**: alice's sandbox forges "another client's cells" from a background thread
  (``status: busy``, ~1 MB of ``execute_input`` code, four ~4 MiB PNG displays, ``idle``, two a
  second, for 10 s), with no call in flight: bytes added to her journal;
- **export**: alice's session holds a ~60 MiB journal; the bridge's peak RSS (VmHWM, reset first)
  while she exports it (``export_notebook(path=...)`` and the notebook resource), and bob's warm
  ``1+1`` median while her exports run beside rounds while they do not (interleaved: the machine's
  other load weighs on both);
- **restore**: ``run_python(restore=<3 cells a "person" typed, each sleeping 20 s>, timeout=5)``.

``--source DIR`` runs the bridge from another tree (``git archive REV kernelbridge
sandbox_kernel_image | tar -x -C DIR``): the same script measures main before the fix. Needs root
(``/proc/<pid>/clear_refs``) and the sandbox image. Prints one line per figure; fails on nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client

from kernelbridge.session.store import SessionStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the suite's harness and attacks
from bridge_harness import children, open_http_bridge, status_kib
from peers.hostile_cells import BIG_CELL, flood

TOKENS = {"alice": "alice-0123456789abcdef-secret", "bob": "bob-fedcba9876543210-secret"}


def workers_of(pid: int) -> list[int]:
    """The bridge's worker processes (``anyio.to_process``: exports, resources, restores)."""
    return [
        child for child in children(pid) if b"anyio.to_process" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]


@contextlib.asynccontextmanager
async def bridge(state: Path, source: Path | None) -> AsyncIterator[tuple[int, dict[str, Client]]]:
    """The test suite's HTTP bridge (tests/bridge_harness.py), from ``source`` when given."""
    env = {"KERNELBRIDGE_WARM_POOL": "0", "KERNELBRIDGE_DURABLE": "0"}  # a throwaway state dir
    command = None
    if source is not None:  # -P: not this checkout from the working directory, the given tree
        env["PYTHONPATH"] = str(source)
        command = [
            sys.executable,
            "-P",
            "-c",
            "import sys; from kernelbridge.cli import main; sys.exit(main())",
        ]
    async with open_http_bridge(state, TOKENS, command=command, **env) as tenants:
        yield tenants["alice"].pid, {name: tenant.client for name, tenant in tenants.items()}


async def run(client: Client, code: str, session: str, **extra: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    answer = await client.call_tool("run_python", {"code": code, "session": session, **extra})
    return time.perf_counter() - began, answer


async def wait_for_file(client: Client, session: str, path: str) -> str:
    with anyio.fail_after(300):
        while True:
            with contextlib.suppress(Exception):
                found = await client.read_resource(f"kernelbridge://sessions/{session}/files/{path}")
                if found.contents:
                    return str(found.contents[0].text)
            await anyio.sleep(0.5)


def journal_of(state: Path, session: str) -> Path:
    """Alice's journal of ``session``: its current generation's, or a bridge's before generations
    (``--source`` of an older tree), which the store reads as generation 0."""
    return SessionStore(state / "http" / "alice", "alice").journal(session)


async def journal_growth(clients: dict[str, Client], state: Path, seconds: float) -> None:
    alice = clients["alice"]
    await run(alice, "x = 1", "flood")
    journal = journal_of(state, "flood")
    before = journal.stat().st_size
    began = time.monotonic()
    await run(alice, flood(seconds), "flood")
    forged = await wait_for_file(alice, "flood", "flood.done")
    await run(alice, "x", "flood")  # after every forged message
    grown = journal.stat().st_size - before
    took = time.monotonic() - began
    print(f"journal growth: {forged} forged cells in {took:.1f} s -> journal +{grown / 2**20:.1f} MiB "
          f"({grown / 2**20 / took:.1f} MiB/s)")  # fmt: skip
    await alice.call_tool("close_session", {"session": "flood"})


async def export_costs(clients: dict[str, Client], pid: int, state: Path, rounds: int) -> None:
    alice, bob = clients["alice"], clients["bob"]
    for _ in range(5):
        await run(alice, BIG_CELL, "big")
    size = journal_of(state, "big").stat().st_size
    await run(bob, "1+1", "warm")
    quiet: list[float] = []
    loaded: list[float] = []
    rss = status_kib(pid, "VmRSS")
    await anyio.Path(f"/proc/{pid}/clear_refs").write_text("5")
    seconds: list[float] = []
    for _ in range(rounds):
        for _ in range(10):
            quiet.append((await run(bob, "1+1", "warm"))[0])
        done = anyio.Event()

        async def export(done: anyio.Event) -> None:
            began = time.perf_counter()
            await alice.call_tool("export_notebook", {"session": "big", "path": "big.ipynb"})
            with contextlib.suppress(Exception):
                await alice.read_resource("kernelbridge://sessions/big/notebook")
            seconds.append(time.perf_counter() - began)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(export, done)
            await anyio.sleep(0.2)
            while not done.is_set():
                loaded.append((await run(bob, "1+1", "warm"))[0])
    peak = status_kib(pid, "VmHWM") - rss
    workers = [status_kib(child, "VmHWM") for child in workers_of(pid)]
    q, l_ = statistics.median(quiet) * 1000, statistics.median(loaded) * 1000
    shown = f"; worker process peak {max(workers) / 1024:.0f} MiB" if workers else " (no worker process)"
    print(f"export of a {size / 2**20:.0f} MiB journal: {statistics.median(seconds):.1f} s; bridge peak "
          f"+{peak / 1024:.0f} MiB over {rss / 1024:.0f} MiB{shown}")  # fmt: skip
    print(f"bob's warm 1+1 during alice's exports: {l_:.1f} ms vs {q:.1f} ms without = {l_ / q:.2f}x "
          f"(+{l_ - q:.1f} ms; {len(loaded)} and {len(quiet)} calls)")  # fmt: skip
    await alice.call_tool("close_session", {"session": "big"})


async def restore_duration(clients: dict[str, Client], state: Path) -> None:
    from nbformat import v4, write

    cells = [v4.new_code_cell("import time; time.sleep(20)") for _ in range(3)]
    for cell in cells:
        cell.metadata["kernelbridge"] = {"source": "client", "client": {"username": "a person"}}
    exports = state / "http" / "alice" / "exports"
    exports.mkdir(parents=True, exist_ok=True)
    write(v4.new_notebook(cells=cells), exports / "forged.ipynb")
    took, _ = await run(clients["alice"], "1", "restored", timeout=5, restore="forged.ipynb")
    print(f"restore of 3 forged 20 s cells with timeout=5: {took:.1f} s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="run the bridge from this tree (PYTHONPATH)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (proves it works)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        async with bridge(state, args.source) as (pid, clients):
            print(f"bridge from {args.source or 'this checkout'}, pid {pid}")
            await journal_growth(clients, state, 3 if args.quick else 10)
            await export_costs(clients, pid, state, 1 if args.quick else 3)
            await restore_duration(clients, state)
            print(json.dumps({"done": True}))


if __name__ == "__main__":
    anyio.run(main)
