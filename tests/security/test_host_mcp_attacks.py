"""Host-MCP attacks from sandboxed code: servers not granted, denied tools, wrong types, 100 MB
arguments (refused ``too_large`` by the kernel side, and by the agent when the kernel side is
bypassed), a burst of 10,000 requests (each answered or refused ``busy``, never a hang), and
the bridge's memory through all of it. The host server is tests/peers/edge_server.py."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator

import pytest
from bridge_harness import REPO, Bridge, open_bridge, reset_peak

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

EDGE = REPO / "tests" / "peers" / "edge_server.py"
MiB = 1024


@pytest.fixture(scope="module")
async def bridge(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> AsyncIterator[Bridge]:
    root = tmp_path_factory.mktemp("hostmcp")
    config = root / "servers.json"
    servers = {
        "edge": {"command": sys.executable, "args": [str(EDGE), "--stderr-lines", "0"]},
        "other": {"command": sys.executable, "args": [str(EDGE), "--name", "other", "--stderr-lines", "0"]},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    env = {"KERNELBRIDGE_SERVERS_CONFIG": str(config), "KERNELBRIDGE_DENY_TOOLS": "edge.fail,edge.env"}
    async with open_bridge(root / "state", **env) as opened:
        yield opened


CALL = r"""
import asyncio
async def attempt(server, tool, arguments):
    try:
        result = await runtime.call_tool(server, tool, arguments)
        return ["ok", bool(result.get("isError")) if isinstance(result, dict) else str(result)[:80]]
    except Exception as exc:
        return [type(exc).__name__, getattr(exc, "kind", None)]
"""


async def probe(bridge: Bridge, session: str, body: str, timeout: int = 120) -> dict:
    result = await bridge.run(CALL + body, session, timeout=timeout, servers=["edge"])
    assert result.status == "ok", result.text
    return result.verdict()


async def test_servers_not_granted_and_denied_tools_are_refused(bridge: Bridge) -> None:
    body = r"""
verdict = {
    "granted": await attempt("edge", "echo", {"text": "hi"}),
    "not_granted": await attempt("other", "echo", {"text": "hi"}),
    "unknown": await attempt("nope", "echo", {}),
    "denied": await attempt("edge", "fail", {}),
    "denied_env": await attempt("edge", "env", {"name": "HOME"}),
    "unknown_tool": await attempt("edge", "rm_rf", {}),
}
import json; print("@@verdict@@" + json.dumps(verdict))
"""
    verdict = await probe(bridge, "mcp-grants", body)
    assert verdict["granted"] == ["ok", False]
    assert verdict["not_granted"] == ["McpServerNotAvailable", "not_available"]
    assert verdict["unknown"] == ["McpServerNotAvailable", "not_available"]
    assert verdict["denied"] == ["McpToolDenied", "denied"]
    assert verdict["denied_env"] == ["McpToolDenied", "denied"]
    assert verdict["unknown_tool"][1] in ("unknown_tool", "denied")


async def test_wrong_types_are_refused(bridge: Bridge) -> None:
    body = r"""
verdict = {
    "not_a_dict": await attempt("edge", "echo", ["x"]),
    "wrong_type": await attempt("edge", "echo", {"text": 5}),
    "missing": await attempt("edge", "echo", {}),
    "server_type": await attempt(5, "echo", {}),
}
import json; print("@@verdict@@" + json.dumps(verdict))
"""
    verdict = await probe(bridge, "mcp-types", body)
    for name, (outcome, detail) in verdict.items():
        # Refused on the host (bad shapes) or by the server's own validation (an error result).
        assert outcome != "ok" or detail is True, (name, verdict)


async def test_a_100_mb_argument_is_refused_on_both_sides(bridge: Bridge) -> None:
    before = bridge.rss_kib()
    reset_peak(bridge.pid)
    body = r"""
import json, os, socket
big = "x" * (100 << 20)
kernel_side = await attempt("edge", "length", {"text": big})
# Bypass the kernel side: write a 100 MB request line on the rpc socket itself.
sock = None
for fd in range(3, 256):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.family == socket.AF_UNIX and s.type == socket.SOCK_STREAM:
        sock = s
        break
    s.close()
raw = "no socket"
if sock is not None:
    head = b'{"type":"rpc_request","id":999999,"method":"call_tool","params":{"server":"edge",'
    line = head + b'"tool":"length","arguments":{"text":"' + b"y" * (100 << 20) + b'"}}}\n'
    sock.sendall(line)
    raw = "sent"
del big
after = await attempt("edge", "echo", {"text": "still works"})
verdict = {"kernel_side": kernel_side, "raw": raw, "after": after}
print("@@verdict@@" + json.dumps(verdict))
"""
    verdict = await probe(bridge, "mcp-huge", body, timeout=180)
    assert verdict["kernel_side"] == ["McpTooLarge", "too_large"], verdict
    assert verdict["raw"] == "sent" and verdict["after"][0] == "ok", verdict
    peak = bridge.peak_kib() - before
    print(f"\n100 MB arguments: bridge peak +{peak // MiB} MiB")
    assert peak < 200 * MiB  # the agent dropped the raw line: the host never held it


BURST = 10_000
"""Calls sent at once: 156 times the cap in flight (``frames.MAX_RPC_IN_FLIGHT``, 64)."""


async def test_a_burst_far_past_the_cap_is_answered_or_refused(bridge: Bridge) -> None:
    before = bridge.rss_kib()
    reset_peak(bridge.pid)
    body = r"""
import collections, time
start = time.monotonic()
results = await asyncio.gather(*(attempt("edge", "echo", {"text": str(i)}) for i in range(BURST)))
counts = collections.Counter(r[0] if r[0] == "ok" else r[1] for r in results)
verdict = {"counts": dict(counts), "seconds": time.monotonic() - start}
import json; print("@@verdict@@" + json.dumps(verdict))
"""
    verdict = await probe(bridge, "mcp-burst", f"BURST = {BURST}\n" + body, timeout=240)
    counts = verdict["counts"]
    assert sum(counts.values()) == BURST
    assert set(counts) <= {"ok", "busy"}, counts
    assert counts.get("ok", 0) >= 64, counts
    peak = bridge.peak_kib() - before
    print(f"\n{BURST:,} requests: {counts} in {verdict['seconds']:.1f} s; bridge peak +{peak // MiB} MiB")
    assert peak < 200 * MiB
    # The session and the server are fine afterwards.
    again = 'verdict = await attempt("edge", "echo", {"text": "x"})\nimport json\n'
    again += 'print("@@verdict@@" + json.dumps(verdict))'
    assert (await probe(bridge, "mcp-burst", again))[0] == "ok"


async def test_one_sessions_tool_answers_never_reach_another(bridge: Bridge) -> None:
    body = r"""
calls = [runtime.call_tool("edge", "echo", {"text": f"{SESSION}-{i}"}) for i in range(50)]
results = await asyncio.gather(*calls)
verdict = sorted(block["text"] for r in results for block in r["content"] if block.get("type") == "text")
import json; print("@@verdict@@" + json.dumps(verdict))
"""
    for session in ("mcp-iso-a", "mcp-iso-b"):
        verdict = await probe(bridge, session, f"SESSION = {session!r}\n" + body)
        assert len(verdict) == 50 and all(answer.startswith(session + "-") for answer in verdict), verdict
