"""Issue 24's start times: what a user waits for before kernelbridge answers, beside references
measured side by side in one run.

    .venv/bin/python bench/bench_start.py [--quick] [--reps N] [--source DIR]

Prints one table (the README's "Start" table):

- spawn to ``initialize`` answered, ``kernelbridge serve`` vs ``mcp-server-time`` (an MCP server
  of the same SDK): both spawned and asked by the same minimal JSON-RPC client over stdio (one
  ``initialize`` line written, the answer read), in alternation; the bridge with every setting at
  its default (durable sessions, a warm pool of one) on a fresh state directory, and on a state
  directory with 5 detached sessions, which a bridge adopts before it answers (bounded by
  ``ADOPTION_WAIT``);
- spawn to exit of ``kernelbridge --version``, ``servers`` and ``sessions`` (on the directory with
  the 5 detached sessions) vs ``python -c pass``;
- a kernelspec kernel's tunnel process (what ``jupyter console --kernel kernelbridge`` starts):
  spawn to exit of its module's import (``--help``) vs ``python -c pass``, and, for a real kernel
  started through jupyter_client, the modules its tunnel process had imported by the time the
  kernel was ready (``-X importtime``, read from its log): no MCP SDK, no ``mcp_types``.

``--source DIR`` measures kernelbridge from another tree too (``git archive REV kernelbridge |
tar -x -C DIR``; run with PYTHONPATH; its kernelspec kernel is not started), in the same
alternation: a before and after in one run. The medians of ``--reps`` runs each, wall clock, with
the CPU time the process had used by then beside it (less moved by a shared machine's load, which
is printed). The ratios are measured side by side in one run, and this script never fails on
timing (``--quick`` only proves that it works). Every sandbox it started is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
LABEL = f"kernelbridge.bench=start-{os.getpid()}"
os.environ["KERNELBRIDGE_LABELS"] = LABEL  # the bridge harness passes it on; every sandbox carries it
from bridge_harness import ensure_image, open_bridge  # noqa: E402 - after the label is set

BIN = Path(sys.executable).parent
KERNELBRIDGE = str(BIN / "kernelbridge")
REFERENCE = str(BIN / "mcp-server-time")
DETACHED = 5
ANSWER_TIMEOUT = 120.0
"""Bound on one ``initialize`` answer (a start that adopts waits for the engine first)."""
EXIT_TIMEOUT = 60.0
"""Bound on a server's exit once its stdin is closed (a bridge lets go of its sandboxes)."""
FORBIDDEN = ("mcp", "mcp_types")
"""What a tunnel process must not import: the MCP SDK (a plain Jupyter kernel has no MCP)."""
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "bench_start", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def clean_env(state: Path | None = None) -> dict[str, str]:
    """This process's environment without kernelbridge settings (each at its default), with the
    bench's label and ``state`` as the state directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBRIDGE_", "MCP_BRIDGE_"))}
    env["KERNELBRIDGE_LABELS"] = LABEL
    if state is not None:
        env["KERNELBRIDGE_STATE_DIR"] = str(state)
    return env


@dataclass(frozen=True)
class Tree:
    """The kernelbridge measured: this checkout's, or another tree's (``--source``)."""

    source: Path | None = None

    @property
    def name(self) -> str:
        return str(self.source) if self.source else "this tree"

    def argv(self, *args: str) -> list[str]:
        if self.source is None:
            return [KERNELBRIDGE, *args]
        return [sys.executable, "-P", "-m", "kernelbridge.cli", *args]  # -P: not the working directory

    def module(self, module: str, *args: str) -> list[str]:
        return [sys.executable, "-P", "-m", module, *args]

    def env(self, state: Path | None = None) -> dict[str, str]:
        env = clean_env(state)
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        return env


Timing = tuple[float, float]
"""(wall-clock seconds, CPU seconds of the process)."""


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


# -- spawn to initialize answered ---------------------------------------------------------------------
def line(message: Mapping[str, object]) -> bytes:
    return json.dumps(message).encode() + b"\n"


async def initialize_seconds(argv: list[str], env: dict[str, str]) -> Timing:
    """Spawn ``argv``, write ``initialize`` on its stdin, time until its answer arrives on stdout;
    then leave as a client does (``initialized``, stdin closed) and wait for the exit (bounded,
    then SIGKILL)."""
    with tempfile.TemporaryFile() as stderr:
        began = time.perf_counter()
        process = await anyio.open_process(argv, env=env, stderr=stderr)
        assert process.stdin is not None and process.stdout is not None
        try:
            await process.stdin.send(line(INITIALIZE))
            lines = BufferedByteReceiveStream(process.stdout)
            with anyio.fail_after(ANSWER_TIMEOUT):
                while True:
                    answer = json.loads(await lines.receive_until(b"\n", 16 * 1024 * 1024))
                    if answer.get("id") == 1:
                        break
            took = time.perf_counter() - began, cpu_of(process.pid)
            if "result" not in answer:
                raise RuntimeError(f"{argv[0]} refused initialize: {answer}")
            await process.stdin.send(line(INITIALIZED))
        except BaseException:
            stderr.seek(0)
            print(stderr.read()[-3000:].decode(errors="replace"), file=sys.stderr)
            raise
        finally:
            await process.stdin.aclose()
            with anyio.move_on_after(EXIT_TIMEOUT):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
    return took


async def sandboxes(state: Path | None = None, *, running: bool = False) -> list[str]:
    """Ids of this bench's containers (of ``state``'s bridges only, if given)."""
    from kernelbridge.config import load_settings
    from kernelbridge.host.container import STATE_LABEL, state_identity
    from kernelbridge.runtime.base import ContainerState
    from kernelbridge.runtime.select import cli_runtime

    key, _, value = LABEL.partition("=")
    labels = {key: value, **({STATE_LABEL: state_identity(state)} if state is not None else {})}
    async with cli_runtime(load_settings(clean_env())) as runtime:
        found = await runtime.list(labels)
    return [c.id for c in found if not running or c.state is ContainerState.RUNNING]


async def remove_sandboxes(state: Path | None = None) -> None:
    """Remove the containers this bench's bridges left (of ``state``'s only, if given): durable
    ones outlive their bridge."""
    from kernelbridge.config import load_settings
    from kernelbridge.runtime.select import cli_runtime

    if found := await sandboxes(state):
        async with cli_runtime(load_settings(clean_env())) as runtime:
            await runtime.remove(found)


async def with_detached(state: Path) -> None:
    """Leave ``DETACHED`` durable sessions on ``state``: made by a bridge that then exits."""
    # A cold sandbox each, none from the warm pool: what is measured is their adoption (and a
    # warm-born session is adoptable only since d0a6c55, which this bench may run without).
    async with open_bridge(state, KERNELBRIDGE_WARM_POOL="0") as bridge:
        for i in range(DETACHED):
            result = await bridge.run(f"x = {i}", f"s{i}")
            assert result.status == "ok", result.text


async def initialize_times(
    root: Path, adopting: Path, trees: list[Tree], reps: int
) -> dict[str, list[Timing]]:
    """mcp-server-time, and each tree's bridge on a fresh state directory and with sessions to
    adopt, ``reps`` times each, in alternation so that they share the machine's load."""
    times: dict[str, list[Timing]] = {"reference": []}
    for i in range(reps):
        times["reference"].append(await initialize_seconds([REFERENCE], clean_env()))
        for n, tree in enumerate(trees):
            fresh = root / f"fresh-{n}-{i}"
            times.setdefault(f"fresh {tree.name}", []).append(
                await initialize_seconds(tree.argv("serve"), tree.env(fresh))
            )
            await remove_sandboxes(fresh)  # its warm sandbox, left for no later bridge
            times.setdefault(f"adopt {tree.name}", []).append(
                await initialize_seconds(tree.argv("serve"), tree.env(adopting))
            )
    # Each of those bridges adopted the sessions and let them go again: they still run.
    assert len(await sandboxes(adopting, running=True)) >= DETACHED, "the detached sessions were lost"
    return times


# -- commands: spawn to exit ------------------------------------------------------------------------
def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def exit_seconds(argv: list[str], env: dict[str, str]) -> Timing:
    began, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    took = time.perf_counter() - began, children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took


COMMANDS = ("--version", "servers", "sessions")


def command_times(state: Path, trees: list[Tree], reps: int) -> dict[str, list[Timing]]:
    """Spawn to exit of each command of each tree, ``reps`` times, in alternation."""
    commands = {"python -c pass": ([sys.executable, "-c", "pass"], clean_env(state))}
    for tree in trees:
        for command in COMMANDS:
            commands[f"{command} {tree.name}"] = (tree.argv(command), tree.env(state))
        tunnel = tree.module("kernelbridge.jupyter.tunnel_process", "--help")
        commands[f"tunnel {tree.name}"] = (tunnel, tree.env(state))
    times: dict[str, list[Timing]] = {name: [] for name in commands}
    for _ in range(reps):
        for name, (argv, env) in commands.items():
            times[name].append(exit_seconds(argv, env))
    return times


# -- a kernelspec kernel's tunnel process -------------------------------------------------------------
def imported(importtime: str) -> tuple[list[str], float]:
    """The modules ``-X importtime`` lines name, and the seconds of the top-level ones together."""
    modules, total = [], 0
    for entry in importtime.splitlines():
        if not entry.startswith("import time:") or "self [us]" in entry:
            continue
        _, cumulative, name = entry[len("import time:") :].split("|")
        modules.append(name.strip())
        if not name.startswith("  "):  # one space after the bar: a top-level import
            total += int(cumulative)
    return modules, total / 1e6


async def tunnel_process_imports(root: Path) -> tuple[list[str], float]:
    """The modules a real kernelspec kernel's tunnel process imported by the time its kernel was
    ready, and their import time: a kernel started through jupyter_client with
    ``PYTHONPROFILEIMPORTTIME`` in its environment, whose tunnel process logs to a file."""
    from kernelbridge.config import load_settings
    from kernelbridge.jupyter.manager import SandboxKernelManager, connect_client

    settings = load_settings(clean_env(root / "kernel"))
    km = SandboxKernelManager(settings=settings, session_name="bench-start")
    await km.start_kernel(env={**clean_env(root / "kernel"), "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        client = await connect_client(km)
        client.stop_channels()
    finally:
        await km.shutdown_kernel(now=True)
    (log,) = settings.logs_dir.glob("kernel-bench-start-*.log")
    return imported(log.read_text(errors="replace"))


# -- the table -----------------------------------------------------------------------------------------
def medians(timings: list[Timing]) -> Timing:
    return statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)


def versus(measured: list[Timing], reference: list[Timing]) -> str:
    (mine, my_cpu), (theirs, their_cpu) = medians(measured), medians(reference)
    return f"{mine:.2f} s vs {theirs:.2f} s = {mine / theirs:.2f}x (CPU {my_cpu:.2f} vs {their_cpu:.2f} s)"


def above(measured: list[Timing], reference: list[Timing]) -> str:
    (mine, my_cpu), (theirs, their_cpu) = medians(measured), medians(reference)
    return f"{mine:.2f} s vs {theirs:.2f} s = +{mine - theirs:.2f} s (CPU {my_cpu:.2f} vs {their_cpu:.2f} s)"


async def main(args: argparse.Namespace) -> None:
    reps = args.reps or (2 if args.quick else 7)
    trees = [Tree(), *([Tree(args.source.resolve())] if args.source else [])]
    loads = [load()]
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        root = Path(tmp)
        adopting = root / "adopting"
        try:
            await with_detached(adopting)
            starts = await initialize_times(root, adopting, trees, reps)
            commands = command_times(adopting, trees, reps)
            modules, import_seconds = await tunnel_process_imports(root)
        finally:
            await remove_sandboxes()
    loads.append(load())
    sdk = sorted({m.split(".")[0] for m in modules if m.split(".")[0] in FORBIDDEN})
    reference, python = starts["reference"], commands["python -c pass"]
    initialize = "`initialize` (spawn to answer)"
    rows = [
        (
            f"{initialize}, fresh state directory: `kernelbridge serve` vs mcp-server-time",
            [versus(starts[f"fresh {t.name}"], reference) for t in trees],
            "<= 1.5x",
        ),
        (
            f"{initialize}, {DETACHED} detached sessions adopted first vs mcp-server-time",
            [versus(starts[f"adopt {t.name}"], reference) for t in trees],
            "(adoption within ADOPTION_WAIT)",
        ),
    ]
    for command in COMMANDS:
        detached = f" ({DETACHED} detached)" if command == "sessions" else ""
        rows.append(
            (
                f"`kernelbridge {command}`{detached} vs `python -c pass`",
                [above(commands[f"{command} {t.name}"], python) for t in trees],
                "<= +0.5 s",
            )
        )
    rows += [
        ("tunnel process module import (`--help`) vs `python -c pass`",
         [above(commands[f"tunnel {t.name}"], python) for t in trees], "-"),
        ("a kernelspec kernel's tunnel process, until its kernel is ready: MCP SDK modules",
         [f"{', '.join(sdk) or 'none'} ({len(modules)} modules, {import_seconds:.2f} s importing)",
          *["-" for _ in trees[1:]]], "none"),
    ]  # fmt: skip
    print(
        f"{'quick' if args.quick else 'full'} run on {os.cpu_count()} cores, {reps} runs each (medians); "
        f"load average {loads[0]} at the start, {loads[1]} at the end"
    )
    print(f"| measure | {' | '.join(t.name for t in trees)} | target |")
    print(f"|---|{'---|' * len(trees)}---|")
    for what, measured, target in rows:
        print(f"| {what} | {' | '.join(measured)} | {target} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 runs each: proves the benchmark works")
    parser.add_argument("--reps", type=int, default=0, help="runs of each measure (default 7; --quick 2)")
    parser.add_argument("--source", type=Path, help="also measure kernelbridge from this tree (PYTHONPATH)")
    ensure_image()
    anyio.run(main, parser.parse_args())
