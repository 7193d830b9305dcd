"""`run_python("1+1")` through the MCP server beside the stateless predecessor's way, in one run.

    .venv/bin/python bench/bench_run_python.py [--calls 30]

The predecessor ran every call as `podman info` plus a fresh `podman run ... python3 -c CODE`.
We reproduce that with the same image and the same sandbox flags, and time a warm kernelbridge
session (real MCP client over stdio, `kernelbridge serve`). Prints medians and their ratio.
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
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from kernelbridge.config import load_settings
from kernelbridge.image import default_image
from kernelbridge.runtime import ContainerSpec, cli_runtime
from kernelbridge.runtime.cli.backend import container_flags


def stateless_call(code: str) -> float:
    """One call the predecessor's way: runtime check, then a fresh container for the code."""
    runtime = cli_runtime(load_settings())
    spec = ContainerSpec(
        image=default_image(),
        name=f"kernelbridge-bench-{os.getpid()}-{time.monotonic_ns()}",
        session="bench",
        owner_pid=os.getpid(),
        command=("python3", "-c", code),
    )
    began = time.perf_counter()
    subprocess.run(
        [runtime.executable, "info", "--format", "{{.Host.OCIRuntime.Name}}"], capture_output=True, check=True
    )
    argv = [runtime.executable, "run", "--rm", "-i", *container_flags(spec), spec.image, *spec.command]
    result = subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - began
    assert result.stdout.strip() == "2", result.stdout
    return elapsed


async def kernelbridge_calls(calls: int) -> list[float]:
    with tempfile.TemporaryDirectory() as state:
        params = StdioServerParameters(
            command=str(Path(sys.executable).with_name("kernelbridge")),
            args=["serve"],
            env={"KERNELBRIDGE_STATE_DIR": state, "KERNELBRIDGE_DURABLE": "0"},  # a throwaway state dir
        )
        async with Client(params, read_timeout_seconds=120) as client:
            await client.call_tool("run_python", {"code": "1+1"})  # session start, not measured
            times = []
            for _ in range(calls):
                began = time.perf_counter()
                result = await client.call_tool("run_python", {"code": "print(1+1)"})
                times.append(time.perf_counter() - began)
                assert result.structured_content["stdout"] == "2\n"
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    stateless = [stateless_call("print(1+1)") for _ in range(max(5, args.calls // 3))]
    bridge = anyio.run(kernelbridge_calls, args.calls)
    old, new = statistics.median(stateless), statistics.median(bridge)
    print("| `print(1+1)`, median per call | stateless (podman info + podman run) | kernelbridge | ratio |")
    print("|---|---|---|---|")
    print(
        f"| one call | {old * 1000:.0f} ms (no MCP) | {new * 1000:.1f} ms (run_python over MCP stdio) "
        f"| {old / new:.0f}x |"
    )


if __name__ == "__main__":
    main()
