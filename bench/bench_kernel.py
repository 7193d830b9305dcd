"""Plain Jupyter clients: cold start and `1+1` round trip of a `kernelbridge` kernel (the
provisioner and its tunnel process) beside a local ipykernel, measured in one run. The bridge's
own sandboxes (tunnel in-process, engine API) are measured by `bench/bench_runtime.py`.

    .venv/bin/python bench/bench_kernel.py [--starts 5] [--round-trips 200]

Both sides use the same jupyter_client code path (AsyncKernelManager + connect_client), so the
ratio isolates the cost of the container and the tunnel. Prints medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from importlib.metadata import version

import anyio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from kernelbridge.jupyter import SandboxKernelManager, connect_client


async def run_cell(kc: AsyncKernelClient, code: str) -> None:
    """Until both the shell reply and iopub idle for this request have arrived. Two tasks wait
    on the two channels at once: polling them in turn with short timeouts would measure the
    polling interval, not the kernel."""
    msg_id = kc.execute(code)

    async def shell_reply() -> None:
        while (await kc.get_shell_msg(timeout=30))["parent_header"].get("msg_id") != msg_id:
            pass

    async def iopub_idle() -> None:
        while True:
            msg = await kc.get_iopub_msg(timeout=30)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(shell_reply)
        tg.start_soon(iopub_idle)


def new_manager(kind: str) -> AsyncKernelManager:
    return (
        SandboxKernelManager(session_name="bench")
        if kind == "sandbox"
        else AsyncKernelManager(kernel_name="python3")
    )


async def measure(kind: str, starts: int, round_trips: int) -> tuple[list[float], list[float]]:
    cold, rtt = [], []
    for i in range(starts):
        began = time.perf_counter()
        km = new_manager(kind)
        await km.start_kernel()
        kc = await connect_client(km)
        await run_cell(kc, "1+1")
        cold.append(time.perf_counter() - began)
        if i == 0:
            for _ in range(20):  # warm up
                await run_cell(kc, "1+1")
            for _ in range(round_trips):
                t = time.perf_counter()
                await run_cell(kc, "1+1")
                rtt.append(time.perf_counter() - t)
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return cold, rtt


async def main(starts: int, round_trips: int) -> None:
    results = {}
    for kind in ("local", "sandbox"):
        results[kind] = await measure(kind, starts, round_trips)
    cold = {k: statistics.median(v[0]) for k, v in results.items()}
    rtt = {k: statistics.median(v[1]) * 1000 for k, v in results.items()}
    print(f"ipykernel {version('ipykernel')} on both sides; {starts} cold starts, {round_trips} round trips")
    print("| what (median) | local ipykernel | sandbox (container + tunnel) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| start -> first `1+1` result | {cold['local']:.3f} s | {cold['sandbox']:.3f} s "
        f"| {cold['sandbox'] / cold['local']:.2f}x |"
    )
    ratio = rtt["sandbox"] / rtt["local"]
    print(f"| `1+1` round trip | {rtt['local']:.2f} ms | {rtt['sandbox']:.2f} ms | {ratio:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--round-trips", type=int, default=200)
    args = parser.parse_args()
    anyio.run(main, args.starts, args.round_trips)
