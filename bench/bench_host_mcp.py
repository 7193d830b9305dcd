"""A trivial host MCP tool call made from sandbox code, beside the same call made directly on the
host with the MCP SDK's client, in one run.

    .venv/bin/python bench/bench_host_mcp.py [--calls 100] [--rounds 5] [--runs 30] [--quick]

The server is the project's edge server (``tests/peers/edge_server.py``, stdio) and the call is
``echo(text="hi")``. Three figures, medians:

- **direct**: the SDK's ``Client.call_tool`` on the host, one call after another (the same server
  program, a process of its own);
- **from the sandbox**: ``await mcp_edge.echo(text="hi")`` and ``mcp_edge.echo.sync(...)`` timed
  with ``perf_counter`` inside a ``run_python`` cell, calls in a row: kernel -> agent -> tunnel ->
  broker -> hub -> the server's client, and back. Rounds of direct calls and in-cell calls
  alternate, both clients open, so that a busy machine's drift hits both sides;
- **end to end**: a ``run_python`` whose cell makes one call, minus the same cell awaiting
  ``asyncio.sleep(0)`` instead: what one call adds to a model's tool call (MCP client to bridge
  included, with the call's record in the journal).

Prints a table with the ratio sandbox/direct (target <= 2) and the milliseconds a call adds.
``--quick`` makes few calls (seconds; CI runs it to prove the script works, not for figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
EDGE = REPO / "tests" / "peers" / "edge_server.py"
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
TIMEOUT = 300.0
"""Bound on the whole run (a cold sandbox and server start take a few seconds)."""
TARGET_RATIO = 2.0

CELL = """
import json, time
times, sync = [], []
for _ in range({calls}):  # alternated, so that drift hits both forms alike
    began = time.perf_counter()
    await mcp_edge.echo(text="hi")
    times.append(time.perf_counter() - began)
    began = time.perf_counter()
    mcp_edge.echo.sync(text="hi")
    sync.append(time.perf_counter() - began)
print(json.dumps({{"async": times, "sync": sync}}))
"""


def edge_server() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(EDGE)])


class Figures:
    def __init__(self) -> None:
        self.direct: list[float] = []
        self.in_cell: list[float] = []
        self.in_cell_sync: list[float] = []
        self.added: list[float] = []


async def direct_calls(client: Client, calls: int, figures: Figures) -> None:
    """``echo`` through the SDK's client on the host."""
    for _ in range(calls):
        began = time.perf_counter()
        result = await client.call_tool("echo", {"text": "hi"})
        figures.direct.append(time.perf_counter() - began)
        assert result.is_error is False


async def measure(calls: int, rounds: int, runs: int, state: Path) -> Figures:
    """Rounds of direct calls and in-cell calls, alternated (both clients stay open, so drift of
    a busy machine hits both), then the end-to-end cost of one call per run_python."""
    servers = state / "servers.json"
    edge = edge_server()
    servers.write_text(json.dumps({"mcpServers": {"edge": {"command": edge.command, "args": edge.args}}}))
    # A throwaway state directory: sessions end with the bridge (none is left running detached).
    env = {"HOME": str(state), "KERNELBRIDGE_STATE_DIR": str(state / "state"), "KERNELBRIDGE_DURABLE": "0"}
    if "KERNELBRIDGE_LABELS" in os.environ:  # the test suite labels every sandbox it causes
        env["KERNELBRIDGE_LABELS"] = os.environ["KERNELBRIDGE_LABELS"]
    params = StdioServerParameters(
        command=str(KERNELBRIDGE), args=["serve", "--servers-config", str(servers)], env=env
    )
    figures = Figures()
    async with (
        Client(edge, read_timeout_seconds=60) as direct,
        Client(params, read_timeout_seconds=120) as bridge,
    ):

        async def run(code: str, **args: object) -> dict:
            result = await bridge.call_tool("run_python", {"code": code, **args})
            assert result.structured_content["status"] == "ok", result.content[0].text
            return result.structured_content

        await run("await mcp_edge.echo(text='warm')", servers=["edge"])  # grant, start the server
        await direct_calls(direct, 5, Figures())  # warm-up
        for _ in range(rounds):
            await direct_calls(direct, calls, figures)
            measured = json.loads((await run(CELL.format(calls=calls), timeout=120))["stdout"])
            figures.in_cell += measured["async"]
            figures.in_cell_sync += measured["sync"]
        await run("import asyncio")
        with_call, without = [], []
        for _ in range(runs):
            # The same cell without the call: both run through IPython's async runner.
            began = time.perf_counter()
            await run("await mcp_edge.echo(text='hi'); None")
            with_call.append(time.perf_counter() - began)
            began = time.perf_counter()
            await run("await asyncio.sleep(0); None")
            without.append(time.perf_counter() - began)
    figures.added = [a - b for a, b in zip(with_call, without, strict=True)]
    return figures


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def added_ms(seconds: float) -> str:
    return f"{seconds * 1000:+.2f} ms"


async def main(calls: int, rounds: int, runs: int) -> int:
    with anyio.fail_after(TIMEOUT), tempfile.TemporaryDirectory(prefix="kb-bench-") as tmp:
        figures = await measure(calls, rounds, runs, Path(tmp))
    base = statistics.median(figures.direct)
    total = calls * rounds
    print(f"host MCP call `echo(text='hi')`, {total} calls each (end to end: {runs} runs), medians")
    print()
    print("| how | direct on the host (SDK client) | from the sandbox | ratio | added |")
    print("|---|---|---|---|---|")
    ratios = []
    rows = (
        ("`await mcp_edge.echo(...)` in a cell", figures.in_cell),
        ("`mcp_edge.echo.sync(...)` in a cell", figures.in_cell_sync),
    )
    for label, times in rows:
        median = statistics.median(times)
        ratios.append(median / base)
        print(f"| {label} | {ms(base)} | {ms(median)} | {median / base:.2f}x | {added_ms(median - base)} |")
    added = statistics.median(figures.added)
    print(f"| end to end: a `run_python` with one call minus one without | | | | {added_ms(added)} |")
    verdict = "met" if max(ratios) <= TARGET_RATIO else "NOT met"
    print()
    print(f"target ratio <= {TARGET_RATIO:g}: {verdict}")
    return 0


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=100, help="calls per round and form (default 100)")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    parser.add_argument("--runs", type=int, default=30, help="run_python pairs end to end (default 30)")
    parser.add_argument("--quick", action="store_true", help="a few calls only: proves the script works")
    args = parser.parse_args()
    calls, rounds, runs = (10, 2, 3) if args.quick else (args.calls, args.rounds, args.runs)
    sys.exit(anyio.run(main, calls, rounds, runs))


if __name__ == "__main__":
    cli()
