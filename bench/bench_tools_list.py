"""Measure the size of kernelbridge's ``tools/list`` response, exactly as it goes over the wire.

Every byte of it is context an agent pays for in every conversation (the stateless predecessor's
was ~200 tokens), so it is tracked here. Speaks raw JSON-RPC over stdio to ``kernelbridge serve``
(no SDK in between), prints bytes and a rough token estimate, and exits non-zero past the budget.

    .venv/bin/python bench/bench_tools_list.py [--budget BYTES]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
DEFAULT_BUDGET = 1200
"""Bytes of the compact JSON `result` of tools/list we accept (about 300 tokens)."""
BYTES_PER_TOKEN = 4  # a rough rule for JSON/English with common tokenizers


def measure() -> tuple[int, int, dict[str, int]]:
    """Return (bytes of the whole JSON-RPC response line, bytes of its result, bytes per tool)."""
    with tempfile.TemporaryDirectory() as state:
        env = {
            **os.environ,
            "KERNELBRIDGE_STATE_DIR": state,
            "KERNELBRIDGE_WARM_POOL": "0",
            "KERNELBRIDGE_DURABLE": "0",
        }
        proc = subprocess.Popen(
            [str(KERNELBRIDGE), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:

            def send(message: dict[str, object]) -> None:
                proc.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]

            def reply(request_id: int) -> bytes:
                while True:
                    line = proc.stdout.readline()  # type: ignore[union-attr]
                    if not line:
                        raise SystemExit("kernelbridge serve exited before answering")
                    if json.loads(line).get("id") == request_id:
                        return line

            send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"}}})  # fmt: skip
            reply(1)
            send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            line = reply(2)
        finally:
            proc.stdin.close()
            proc.wait(timeout=60)
    result = json.loads(line)["result"]
    per_tool = {t["name"]: len(json.dumps(t, separators=(",", ":"))) for t in result["tools"]}
    return len(line.rstrip(b"\n")), len(json.dumps(result, separators=(",", ":"))), per_tool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="maximum bytes of the result")
    args = parser.parse_args()
    wire, result, per_tool = measure()
    print(f"tools/list response on the wire: {wire} bytes (JSON-RPC line)")
    print(f"tools/list result, compact JSON: {result} bytes, ~{result // BYTES_PER_TOKEN} tokens")
    for name, size in per_tool.items():
        print(f"  {name:16} {size:5} bytes")
    if result > args.budget:
        print(f"over budget: {result} > {args.budget} bytes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
