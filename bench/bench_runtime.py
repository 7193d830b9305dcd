"""The host cost and latency of sandboxes, each measured beside its local reference in one run.

    .venv/bin/python bench/bench_runtime.py [--quick] [--runtime podman-api|podman-cli|docker-api|...]
    .venv/bin/python bench/bench_runtime.py --only warm [--path]

Prints one table (the README's "Runtimes" table):

- host memory per idle session: the proportional set size (PSS: shared pages split between the
  processes sharing them) of every host process outside the containers (the bridge, runtime
  client processes, conmon/shims, the engine service), with 1 session and with 1+K, divided by K;
- cold session start (start -> first ``1+1`` result) vs a local ipykernel's, same ipykernel version;
- a ``1+1`` round trip through the tunnel's Jupyter sockets vs a local ipykernel's, with the same
  jupyter_client code on both sides;
- a warm ``run_python`` over MCP stdio vs a local ``1+1`` round trip;
- 20 sessions started at once through one bridge, until all answered;
- a warm call's latency with N idle sessions beside it vs none.

Timings vary with the machine's load: the ratios are measured side by side in one run, and this
script never fails on timing (``--quick`` only proves that it works).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
from bench_kernel import run_cell  # same directory: the same client code path in both benches
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from kernelbridge.config import load_settings
from kernelbridge.host import Sandbox, SandboxHandlers, expected_image
from kernelbridge.jupyter import connect_client
from kernelbridge.runtime import open_selection
from kernelbridge.session.recorder import Recorder

KERNELBRIDGE = str(Path(sys.executable).with_name("kernelbridge"))
CALL_TIMEOUT = 180.0


# -- the reference: a local ipykernel through jupyter_client -------------------------------------
async def round_trips(kc: AsyncKernelClient, count: int) -> list[float]:
    for _ in range(10):  # warm up
        await run_cell(kc, "1+1")
    times = []
    for _ in range(count):
        began = time.perf_counter()
        await run_cell(kc, "1+1")
        times.append(time.perf_counter() - began)
    return times


async def local_kernel(starts: int, trips: int) -> tuple[list[float], list[float]]:
    cold: list[float] = []
    rtt: list[float] = []
    for i in range(starts):
        began = time.perf_counter()
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel()
        kc = await connect_client(km)
        await run_cell(kc, "1+1")
        cold.append(time.perf_counter() - began)
        if i == 0:
            rtt = await round_trips(kc, trips)
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return cold, rtt


# -- sandboxes of a bridge (in-process: the bridge's own code path) --------------------------------
async def sandbox_kernel(
    runtime_name: str | None, starts: int, trips: int
) -> tuple[list[float], list[float]]:
    env = dict(os.environ)
    if runtime_name:
        env["KERNELBRIDGE_RUNTIME"] = runtime_name
    with tempfile.TemporaryDirectory() as state:
        env["KERNELBRIDGE_STATE_DIR"] = state
        settings = load_settings(env)
        image, agent_hash = expected_image(settings)
        cold: list[float] = []
        rtt: list[float] = []
        async with open_selection(settings) as selection, anyio.create_task_group() as tg:
            print(f"runtime: {selection.reason}", file=sys.stderr)
            for i in range(starts):
                began = time.perf_counter()
                sandbox = Sandbox.create(
                    settings, selection.backend, f"bench{i}", image=image, agent_hash=agent_hash
                )
                recorder = Recorder(1000)
                await tg.start(partial(sandbox.run, SandboxHandlers(recorder.on_iopub, recorder.on_reply)))
                cell = recorder.expect(os.urandom(8).hex(), "1+1")
                await sandbox.kernel.execute("1+1", msg_id=cell.msg_id, wait=False)
                with anyio.fail_after(60):
                    while not cell.done:
                        await cell.changed(time.monotonic() + 1)
                cold.append(time.perf_counter() - began)
                if i == 0:
                    # The tunnel's Jupyter sockets, with the same client code as the local kernel.
                    kc = AsyncKernelClient(connection_file=str(sandbox.connection_file))
                    kc.load_connection_file()
                    kc.start_channels()
                    await kc.wait_for_ready(timeout=30)
                    rtt = await round_trips(kc, trips)
                    kc.stop_channels()
                await sandbox.close()
        return cold, rtt


# -- a bridge over MCP stdio -------------------------------------------------------------------------
@asynccontextmanager
async def bridge(runtime_name: str | None, **extra: str) -> AsyncIterator[tuple[Client, Path]]:
    with tempfile.TemporaryDirectory() as state:
        # A throwaway state directory: sessions end with the bridge (none is left running detached).
        env = {"KERNELBRIDGE_STATE_DIR": state, "KERNELBRIDGE_DURABLE": "0", **extra}
        if runtime_name:
            env["KERNELBRIDGE_RUNTIME"] = runtime_name
        params = StdioServerParameters(command=KERNELBRIDGE, args=["serve"], env=env)
        async with Client(params, read_timeout_seconds=CALL_TIMEOUT) as client:
            yield client, Path(state)


async def call(client: Client, code: str, session: str = "default") -> float:
    began = time.perf_counter()
    result = await client.call_tool("run_python", {"code": code, "session": session})
    elapsed = time.perf_counter() - began
    if result.is_error:
        raise RuntimeError(f"run_python failed: {result.content[0].text}")  # type: ignore[union-attr]
    return elapsed


async def warm_calls(client: Client, count: int, session: str = "default") -> list[float]:
    await call(client, "1+1", session)
    for _ in range(5):
        await call(client, "1+1", session)
    return [await call(client, "1+1", session) for _ in range(count)]


async def concurrent_starts(runtime_name: str | None, sessions: int) -> float:
    async with bridge(runtime_name, KERNELBRIDGE_WARM_POOL="0", KERNELBRIDGE_MAX_SESSIONS=str(sessions)) as (
        client,
        _,
    ):
        await call(client, "1+1", "first")  # the bridge itself is up; not measured
        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(sessions - 1):
                tg.start_soon(call, client, "1+1", f"s{i}")
        return time.perf_counter() - began


async def idle_sessions_latency(
    runtime_name: str | None, idle: int, count: int
) -> tuple[list[float], list[float]]:
    async with bridge(runtime_name, KERNELBRIDGE_MAX_SESSIONS=str(idle + 2)) as (client, _):
        calm = await warm_calls(client, count)
        with anyio.fail_after(CALL_TIMEOUT + idle * 3):
            async with anyio.create_task_group() as tg:
                limiter = anyio.CapacityLimiter(8)

                async def start(i: int) -> None:
                    async with limiter:
                        await call(client, "x = 1", f"idle{i}")

                for i in range(idle):
                    tg.start_soon(start, i)
        busy = await warm_calls(client, count)
        return calm, busy


# -- host memory ------------------------------------------------------------------------------------
def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def host_processes(bridge_pid: int, containers: set[str]) -> dict[int, str]:
    """The bridge and its descendants (runtime clients, an engine service of its own), and the
    conmon / containerd-shim processes of ``containers`` (ids): every host process that exists
    because of these sessions. Processes of other bridges or tests on the machine are left out."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(stat[stat.rfind(")") + 2 :].split()[1])
        names[pid] = " ".join(part.decode(errors="replace") for part in cmdline)
    chosen: dict[int, str] = {}
    for pid, name in names.items():
        ancestor = pid
        while ancestor > 1 and ancestor != bridge_pid:
            ancestor = parents.get(ancestor, 1)
        monitors = ("conmon" in name or "containerd-shim" in name) and any(c in name for c in containers)
        if ancestor == bridge_pid or monitors:
            chosen[pid] = name.split()[0].rsplit("/", 1)[-1] if pid != bridge_pid else "bridge"
    return chosen


async def session_containers(label: str) -> set[str]:
    """Ids of the containers carrying ``label`` (whatever engine runs them)."""
    from kernelbridge.runtime import cli_runtime

    key, _, value = label.partition("=")
    async with cli_runtime(load_settings()) as runtime:  # listing only: the CLI is enough
        return {c.id for c in await runtime.list({key: value})}


def sampled_pss(bridge_pid: int, containers: set[str], samples: int = 5) -> tuple[float, dict[str, float]]:
    """Median total PSS (MiB) over a few samples (engine services breathe with their GC), and the
    last sample by process kind."""
    totals = []
    kinds: dict[str, float] = {}
    for _ in range(samples):
        processes = host_processes(bridge_pid, containers)
        kinds = {}
        for pid, kind in processes.items():
            kinds[kind] = kinds.get(kind, 0) + pss_kib(pid) / 1024
        totals.append(sum(kinds.values()))
        time.sleep(0.5)
    return statistics.median(totals), kinds


def serve_pid(state: Path) -> int:
    marker = f"KERNELBRIDGE_STATE_DIR={state}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ and b"serve" in cmdline:
            return int(entry.name)
    raise RuntimeError("the bridge process was not found")


async def memory_per_session(runtime_name: str | None, extra: int) -> tuple[float, float, dict[str, float]]:
    """(MiB with one session, MiB per added idle session, MiB by process kind with 1+K)."""
    label = f"kernelbridge.bench={os.getpid()}"
    async with bridge(
        runtime_name,
        KERNELBRIDGE_WARM_POOL="0",
        KERNELBRIDGE_MAX_SESSIONS=str(extra + 2),
        KERNELBRIDGE_LABELS=label,
    ) as (client, state):
        await call(client, "x = 1", "one")
        pid = serve_pid(state)
        one, _ = sampled_pss(pid, await session_containers(label))
        for i in range(extra):
            await call(client, "x = 1", f"more{i}")
        many, kinds = sampled_pss(pid, await session_containers(label))
        return one, (many - one) / extra, kinds


# -- the table ---------------------------------------------------------------------------------------
def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def sandbox_class_kernel(workdir: Path) -> AsyncKernelManager:
    """A local kernel started as the sandbox's agent starts it (its kernel class, out stream and
    extensions: ``kernel_argv``), without a host: the second reference of the warm measure."""
    from jupyter_client.kernelspec import KernelSpecManager

    from kernelbridge.inside.agent.kernel_process import PYTHONPATH_DIR, kernel_argv

    spec_dir = workdir / "kernels" / "sandbox-class"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": kernel_argv("{connection_file}"),
        "display_name": "the sandbox's kernel class, local",
        "language": "python",
        "env": {"PYTHONPATH": f"{PYTHONPATH_DIR}{os.pathsep}{Path(__file__).resolve().parents[1]}"},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
    return AsyncKernelManager(kernel_name="sandbox-class", kernel_spec_manager=specs)


async def warm_beside_local(
    runtime_name: str | None, rounds: int, workdir: Path | None
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Warm ``run_python`` calls (the SDK's ``Client``, and its ``ClientSession`` on the same stdio
    streams) and local ``1+1`` round trips (a stock ipykernel; with ``workdir``, also one of the
    sandbox's kernel class, which tells the path's cost from the kernel's: a fourth busy process,
    so apart from the target's measure), interleaved round by round so that all see the same
    load, the two clients in alternating order: (local, Client, ClientSession, local of the
    sandbox's class) seconds."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import stdio_client

    local: list[float] = []
    same_class: list[float] = []
    via_client: list[float] = []
    via_session: list[float] = []
    async with AsyncExitStack() as kernels:
        kc = await kernels.enter_async_context(warmed(AsyncKernelManager(kernel_name="python3")))
        same_kc = None
        if workdir is not None:
            same_kc = await kernels.enter_async_context(warmed(sandbox_class_kernel(workdir)))
        async with bridge(runtime_name) as (client, state):
            await warm_calls(client, 5)
            env = {"KERNELBRIDGE_STATE_DIR": str(state / "second"), "KERNELBRIDGE_DURABLE": "0"}
            if runtime_name:
                env["KERNELBRIDGE_RUNTIME"] = runtime_name
            params = StdioServerParameters(command=KERNELBRIDGE, args=["serve"], env=env)
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                for _ in range(6):
                    await session.call_tool("run_python", {"code": "1+1"})

                async def through_session() -> None:
                    began = time.perf_counter()
                    await session.call_tool("run_python", {"code": "1+1"})
                    via_session.append(time.perf_counter() - began)

                async def through_client() -> None:
                    via_client.append(await call(client, "1+1"))

                for index in range(rounds):
                    if same_kc is not None:
                        same_class += await round_trips_only(same_kc, 1)
                    local += await round_trips_only(kc, 1)
                    # The call right after the local one shares the cores with that kernel's
                    # after-work: the two clients take that place in turn.
                    first, second = (through_client, through_session)[:: 1 if index % 2 else -1]
                    await first()
                    await second()
    return local, via_client, via_session, same_class


@asynccontextmanager
async def warmed(km: AsyncKernelManager) -> AsyncIterator[AsyncKernelClient]:
    """``km``'s kernel started and a client connected, its first round trips made; both stopped
    on leaving, whatever failed after the start."""
    await km.start_kernel()
    try:
        kc = await connect_client(km)
        try:
            await round_trips(kc, 5)
            yield kc
        finally:
            kc.stop_channels()
    finally:
        await km.shutdown_kernel(now=True)


async def round_trips_only(kc: AsyncKernelClient, count: int) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        await run_cell(kc, "1+1")
        times.append(time.perf_counter() - began)
    return times


async def main(args: argparse.Namespace) -> None:
    if args.only == "warm":
        with tempfile.TemporaryDirectory(prefix="kb-bench-warm-") as workdir:
            local, via_client, via_session, same_class = await warm_beside_local(
                args.runtime, 40 if args.quick else 200, Path(workdir) if args.path else None
            )
        print(f"warm `run_python` vs local `1+1`, interleaved ({len(local)} rounds):")
        for name, times in (("Client", via_client), ("ClientSession", via_session)):
            ratio = median_ms(times) / median_ms(local)
            measured = f"{median_ms(times):.2f} ms vs {median_ms(local):.2f} ms = {ratio:.2f}x"
            print(f"  {name}: {measured} (target <= 1.3x)")
        if not same_class:
            return
        print("the path alone: the same calls vs a local kernel of the sandbox's class (its flags):")
        for name, times in (("Client", via_client), ("ClientSession", via_session)):
            ratio = median_ms(times) / median_ms(same_class)
            print(f"  {name}: {median_ms(times):.2f} ms vs {median_ms(same_class):.2f} ms = {ratio:.2f}x")
        return
    quick = args.quick
    starts, trips, calls = (2, 30, 20) if quick else (5, 200, 100)
    extra, idle, concurrent = (3, 5, 5) if quick else (10, args.idle, 20)
    local_cold, local_rtt = await local_kernel(starts, trips)
    sandbox_cold, sandbox_rtt = await sandbox_kernel(args.runtime, starts, trips)
    async with bridge(args.runtime) as (client, _):
        warm = await warm_calls(client, calls)
    all_started = await concurrent_starts(args.runtime, concurrent)
    calm, busy = await idle_sessions_latency(args.runtime, idle, calls)
    base, per_session, kinds = await memory_per_session(args.runtime, extra)

    rows = [
        (
            f"host memory per idle session (PSS, 1 vs 1+{extra} sessions)",
            f"{per_session:.1f} MiB",
            "<= 8 MiB",
        ),
        (
            "cold session start vs local ipykernel start",
            f"{statistics.median(sandbox_cold):.2f} s vs {statistics.median(local_cold):.2f} s = "
            f"{statistics.median(sandbox_cold) / statistics.median(local_cold):.2f}x",
            "<= 1.4x",
        ),
        (
            "tunnel `1+1` round trip vs local ipykernel",
            f"{median_ms(sandbox_rtt):.2f} ms vs {median_ms(local_rtt):.2f} ms = "
            f"{median_ms(sandbox_rtt) / median_ms(local_rtt):.2f}x",
            "<= 1.1x",
        ),
        (
            "warm `run_python` over MCP stdio vs local `1+1`",
            f"{median_ms(warm):.2f} ms vs {median_ms(local_rtt):.2f} ms = "
            f"{median_ms(warm) / median_ms(local_rtt):.2f}x",
            "<= 1.5x",
        ),
        (f"{concurrent} sessions started at once, until all answer", f"{all_started:.1f} s", "<= 6 s"),
        (
            f"warm-call latency with {idle} idle sessions vs none",
            f"{median_ms(busy):.2f} ms vs {median_ms(calm):.2f} ms = "
            f"{median_ms(busy) / median_ms(calm):.2f}x",
            "<= 1.2x",
        ),
    ]
    print(f"runtime: {args.runtime or 'auto'}; {'quick' if quick else 'full'} run on {os.cpu_count()} cores")
    print("| measure | measured | target |")
    print("|---|---|---|")
    for what, measured, target in rows:
        print(f"| {what} | {measured} | {target} |")
    by_kind = json.dumps({k: round(v, 1) for k, v in kinds.items()})
    print(f"host processes with 1+{extra} sessions (PSS MiB): {by_kind}")
    print(f"host PSS with one session: {base:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: proves the benchmark works")
    parser.add_argument(
        "--runtime", default=None, help="KERNELBRIDGE_RUNTIME for the sandboxes (default: auto)"
    )
    parser.add_argument("--idle", type=int, default=100, help="idle sessions beside the measured one")
    parser.add_argument("--only", choices=["warm"], help="one measure: the warm call beside a local 1+1")
    parser.add_argument(
        "--path",
        action="store_true",
        help="with --only warm: also beside a local kernel of the sandbox's class (the path's own cost)",
    )
    anyio.run(main, parser.parse_args())
