"""Where a warm ``run_python`` spends its time, stage by stage, as the bridge itself sees it:

    .venv/bin/python bench/bench_warm_stages.py [--calls 300]

The bridge runs in this script's own process image (``--as-bridge``), which wraps a few of its
methods to note the time, then serves stdio as ``kernelbridge serve`` does. The driver makes warm
``1+1`` calls through the SDK's ``Client`` and prints the median of each stage:

- the client's share (its call time minus the bridge's request-to-response time);
- the request's way down in the bridge (line read -> the frame sent to the sandbox), with the
  points it passes (the SDK, the tool, the registry, the session, the runner);
- the sandbox's share (frame sent -> first frame back, first -> last frame);
- the result's way back (last frame -> the response line written).

What it is for: telling the bridge's own Python from the engine's hops and the kernel before
changing the hot path (bench_runtime.py's ``--only warm`` gives the ratio it is judged by). The
wrapping adds a few microseconds per stage. Never fails on timing.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

MARKED = (
    ("kernelbridge.server.arguments", "CheckedTool", "run"),
    ("kernelbridge.session.registry", "SessionRegistry", "run"),
    ("kernelbridge.session.session", "Session", "execute"),
    ("kernelbridge.session.runner", "CellRunner", "run"),
    ("kernelbridge.tunnel.core", "Tunnel", "send_frame"),
)
"""Methods on the way of a cell, in order: their entry (down) and exit (back) are noted."""

WARM_UP = 20
"""Calls before the measured ones (the first starts the session): left out of the stages too."""
Event = tuple[str, float, bool]
"""(what, perf_counter, flag): the flag says a line/write was a tools/call request/result."""


# -- the bridge side: note the times, then serve ---------------------------------------------------
def as_bridge(log_path: str) -> None:
    from kernelbridge.runtime.engine import stream
    from kernelbridge.server import stdio

    log: list[Event] = []
    _wrap(stdio._PipeLines, "__anext__", lambda line: ("request", '"tools/call"' in line), log, before=False)
    _wrap(stdio._PipeWriter, "write", lambda text: ("response", '"content"' in text), log, before=True)
    _wrap(stream.EngineStream, "send", lambda item: ("sent", True), log, before=False)
    _wrap(stream.EngineStream, "receive", lambda data: ("received", True), log, before=False)
    for module, cls, name in MARKED:
        owner = getattr(importlib.import_module(module), cls)
        _mark(owner, name, f"{cls}.{name}", log)
    atexit.register(lambda: Path(log_path).write_text(json.dumps(log)))
    from kernelbridge.cli.main import main

    sys.argv = ["kernelbridge", "serve"]
    main()


def _wrap(
    owner: Any, name: str, what: Callable[[Any], tuple[str, bool]], log: list[Event], *, before: bool
) -> None:
    """Note ``what(argument or result)`` before the call (``before``) or after it returns."""
    original = getattr(owner, name)

    @functools.wraps(original)
    async def noted(self: Any, *args: Any) -> Any:
        if before:
            kind, flag = what(args[0])
            log.append((kind, time.perf_counter(), flag))
            return await original(self, *args)
        value = await original(self, *args)
        kind, flag = what(value if value is not None else args[0])
        log.append((kind, time.perf_counter(), flag))
        return value

    setattr(owner, name, noted)


def _mark(owner: Any, name: str, label: str, log: list[Event]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def marked(*args: Any, **kwargs: Any) -> Any:
        log.append((f"{label} down", time.perf_counter(), True))
        try:
            return await original(*args, **kwargs)
        finally:
            log.append((f"{label} back", time.perf_counter(), True))

    setattr(owner, name, marked)


# -- the driver: warm calls, then the stages of each ------------------------------------------------
async def drive(calls: int, log_path: Path, state: Path) -> list[float]:
    # A throwaway state directory and no durable sessions, as bench_runtime.py's warm measure:
    # nothing is left running detached when the bridge exits.
    env = {"KERNELBRIDGE_STATE_DIR": str(state), "KERNELBRIDGE_DURABLE": "0"}
    params = StdioServerParameters(
        command=sys.executable, args=[__file__, "--as-bridge", str(log_path)], env=env
    )
    times = []
    async with Client(params, read_timeout_seconds=180) as client:
        for _ in range(WARM_UP):  # the session starts, then warms up
            await client.call_tool("run_python", {"code": "1+1"})
        for _ in range(calls):
            began = time.perf_counter()
            result = await client.call_tool("run_python", {"code": "1+1"})
            times.append(time.perf_counter() - began)
            if result.is_error:
                raise RuntimeError(f"run_python failed: {result.content[0].text}")  # type: ignore[union-attr]
    return times


def stages(events: list[Event]) -> list[dict[str, Any]]:
    """One dict per tools/call: the first time of each event, and every frame received."""
    calls: list[dict[str, Any]] = []
    for kind, at, flag in events:
        if kind == "request":
            if flag:
                calls.append({"request": at, "received": []})
        elif not calls or not flag:
            continue
        elif kind == "received":
            calls[-1]["received"].append(at)
        else:
            calls[-1].setdefault(kind, at)
    return [c for c in calls if "response" in c and "sent" in c and c["received"]]


def report(calls: list[dict[str, Any]], client_times: list[float]) -> None:
    def median_ms(of: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(of(c) for c in calls) * 1000

    def last_frame(c: dict[str, Any]) -> float:
        return max(t for t in c["received"] if t < c["response"])

    def row(label: str, ms: float) -> None:
        print(f"  {label:<52} {ms:6.2f}")

    inside = median_ms(lambda c: c["response"] - c["request"])
    print(f"warm `run_python` of `1+1`, {len(calls)} calls, median ms:")
    row("the client (its call time minus the bridge's)", statistics.median(client_times) * 1000 - inside)
    row("request line -> frame sent", median_ms(lambda c: c["sent"] - c["request"]))
    for _, cls, name in MARKED:
        point = f"{cls}.{name} down"
        row(f"  request line -> {point}", median_ms(lambda c, k=point: c[k] - c["request"]))
    row("frame sent -> first frame back", median_ms(lambda c: c["received"][0] - c["sent"]))
    row("first frame -> last frame", median_ms(lambda c: last_frame(c) - c["received"][0]))
    for _, cls, name in reversed(MARKED[:-1]):
        point = f"{cls}.{name} back"
        row(f"  last frame -> {point}", median_ms(lambda c, k=point: c[k] - last_frame(c)))
    row("last frame -> response written", median_ms(lambda c: c["response"] - last_frame(c)))
    reads = statistics.median(len(c["received"]) for c in calls)
    print(f"  reads from the engine stream per call: {reads:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="measured warm calls")
    parser.add_argument("--as-bridge", metavar="LOG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_bridge:
        as_bridge(args.as_bridge)
        return
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "events.json"
        client_times = anyio.run(drive, args.calls, log_path, Path(tmp) / "state")
        report(stages(json.loads(log_path.read_text()))[WARM_UP:], client_times)


if __name__ == "__main__":
    main()
