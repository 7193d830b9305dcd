"""The rpc path of host MCP calls, end to end (MCP client -> ``kernelbridge serve`` -> sandbox ->
host server and back): calls in parallel, 10 MB each way, output that keeps streaming while a call
is slow, cancellation at a cell's timeout, ids per session, a burst of thousands of requests, a
host server killed mid-call, and proxies rebound after a kernel restart.

One bridge serves this module (``peers.host_bridge``); each test uses its own sessions. The edge
server's ``wait`` tool records each call's fate in a file (``EDGE_STATE_DIR``), so the tests see
from outside whether a call reached the server and whether the host cancelled it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import AsyncIterator

import anyio
import pytest
from mcp.client.client import Client
from peers.host_bridge import HostConfig, fate, open_bridge, printed, run, text_of
from waiting import hang_guard

pytestmark = [pytest.mark.anyio, pytest.mark.podman]


@pytest.fixture(scope="module")
async def bridge(host: HostConfig) -> AsyncIterator[Client]:
    async with open_bridge(host, KERNELBRIDGE_MAX_SESSIONS="12") as client:
        yield client


@pytest.fixture
async def sessions(bridge: Client, request: pytest.FixtureRequest) -> AsyncIterator[list[str]]:
    """Two session names of this test's own, closed afterwards."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name.removeprefix("test_"))[:50]
    names = [f"{base}-a", f"{base}-b"]
    yield names
    with anyio.fail_after(60):
        for name in names:
            await bridge.call_tool("close_session", {"session": name})


GATHER = """
import asyncio, json
# Each call answers only once all twenty are in flight at the edge server.
results = await asyncio.gather(*(mcp_edge.meet(group="gather", count=20) for i in range(20)))
print(json.dumps({"texts": [r["content"][0]["text"] for r in results]}))
"""


async def test_twenty_calls_at_once_are_answered_correctly_and_in_parallel(
    bridge: Client, sessions: list[str]
) -> None:
    await run(bridge, "await mcp_edge.echo(text='warm')", session=sessions[0], servers=["edge"])
    out = printed(await run(bridge, GATHER, session=sessions[0]))
    assert out["texts"] == ["gather met 20"] * 20


TEN_MB = """
import json, time
started = time.monotonic()
size = await mcp_edge.length(text="é" * 5_000_000)
huge = await mcp_edge.huge(n_bytes=10_000_000)
text = huge["content"][0]["text"]
print(json.dumps({
    "length": size["structuredContent"]["result"],
    "huge": len(text),
    "all_x": text == "x" * 10_000_000,
    "seconds": time.monotonic() - started,
}))
"""


async def test_ten_megabytes_each_way(bridge: Client, sessions: list[str]) -> None:
    result = await run(bridge, TEN_MB, session=sessions[0], servers=["edge"], timeout=120)
    out = printed(result)
    assert (out["length"], out["huge"], out["all_x"]) == (5_000_000, 10_000_000, True)
    print(f"10 MB argument + 10 MB result over stdio: {out['seconds']:.2f} s")
    # The journal keeps the calls' records, not 10 MB copies of them.
    calls = result.structured_content["tool_calls"]
    assert [(c["tool"], c["ok"]) for c in calls] == [("length", True), ("huge", True)]


TICKS = """
import asyncio
call = asyncio.ensure_future(mcp_edge.wait(key="ticks", seconds=7))
for i in range(7):
    print("tick", i, flush=True)
    await asyncio.sleep(1)
print((await call)["content"][0]["text"])
"""


async def test_a_slow_call_never_blocks_output_or_other_sessions(
    bridge: Client, sessions: list[str], host: HostConfig
) -> None:
    slow, other = sessions
    await run(bridge, "x = 1", session=other)
    await run(bridge, "await mcp_edge.echo(text='warm')", session=slow, servers=["edge"])
    progress: list[tuple[float, str]] = []
    done = anyio.Event()
    began = time.monotonic()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((time.monotonic() - began, message or ""))

    async def slow_cell() -> None:
        result = await bridge.call_tool(
            "run_python", {"code": TICKS, "session": slow}, progress_callback=on_progress
        )
        assert result.structured_content["stdout"].endswith("ticks waited 7\n"), text_of(result)
        done.set()

    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_cell)
            await fate(host.edge_state, "ticks", "started")
            # Another session runs a cell (and a host call) while the slow call is in flight.
            quick = await run(bridge, "x + 1", session=other)
            assert quick.structured_content["result"] == "2" and not done.is_set()
    assert await anyio.Path(host.edge_state / "ticks").read_text() == "done"
    # Outputs kept flowing during the call: progress reports carried new ticks before it ended.
    ticks = [int(m) for _, message in progress for m in re.findall(r"tick (\d)", message)]
    assert len(progress) >= 2 and ticks, progress
    assert max(ticks) >= 3, f"no fresh output reached the host while the call ran: {progress}"


BLOCKING = """
print("before the call", flush=True)
result = mcp_edge.wait.sync(key="blocking", seconds=5)
print(result["content"][0]["text"])
"""


async def test_output_before_a_blocking_sync_call_reaches_the_host_during_the_call(
    bridge: Client, sessions: list[str], host: HostConfig
) -> None:
    session = sessions[0]
    await run(bridge, "await mcp_edge.echo(text='warm')", session=session, servers=["edge"])
    seen_during_call: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        state = await anyio.Path(host.edge_state / "blocking").read_text()
        if state.startswith("started"):
            seen_during_call.append(message or "")

    with anyio.fail_after(60):
        result = await bridge.call_tool(
            "run_python", {"code": BLOCKING, "session": session}, progress_callback=on_progress
        )
    assert result.structured_content["stdout"] == "before the call\nblocking waited 5\n"
    assert any("before the call" in message for message in seen_during_call), seen_during_call


TIMEOUT_CELL = """
import mcp
try:
    await mcp_edge.wait(key="timeout", seconds=120)
except mcp.McpCancelled as exc:
    print("cancelled:", exc)
"""


async def test_a_call_running_at_the_cell_timeout_is_cancelled_on_the_host(
    bridge: Client, sessions: list[str], host: HostConfig
) -> None:
    session = sessions[0]
    await run(bridge, "await mcp_edge.echo(text='warm')", session=session, servers=["edge"])
    with hang_guard(60, "a timeout=3 cell whose host call waits 120 s"):
        result = await run(bridge, TIMEOUT_CELL, session=session, timeout=3)
    sc = result.structured_content
    assert sc["status"] == "timeout" and sc["state"] == "kept", text_of(result)
    assert await fate(host.edge_state, "timeout", "cancelled", "done", timeout=10) == "cancelled"
    (call,) = sc["tool_calls"]
    assert call["tool"] == "wait" and call["ok"] is False and call["error"].startswith("cancelled:")
    after = await run(bridge, "(await mcp_edge.echo(text='after'))['content'][0]['text']", session=session)
    assert after.structured_content["result"] == "'after'"
    # A blocking .sync() call at the timeout: cancelled on the host too, and the kernel carries on.
    blocking = "mcp_edge.wait.sync(key='timeout_sync', seconds=120)"
    blocked = await run(bridge, blocking, session=session, timeout=3)
    assert blocked.structured_content["status"] == "timeout", text_of(blocked)
    assert await fate(host.edge_state, "timeout_sync", "cancelled", "done", timeout=10) == "cancelled"
    again = await run(bridge, "(await mcp_edge.echo(text='again'))['content'][0]['text']", session=session)
    assert again.structured_content["result"] == "'again'"


IDS = """
import asyncio, json
from mcp import _transport
client = _transport.connect()
first = next(client._ids)
texts = []
for round in range(3):
    results = await asyncio.gather(*(mcp_edge.echo(text=f"{TAG}-{round}-{i}") for i in range(60)))
    texts += [r["content"][0]["text"] for r in results]
last = next(client._ids)
expected = [f"{TAG}-{round}-{i}" for round in range(3) for i in range(60)]
print(json.dumps({"ids": [first, last], "wrong": [t for t, e in zip(texts, expected) if t != e]}))
"""


async def test_ids_are_per_session(bridge: Client, sessions: list[str]) -> None:
    """Two kernels number their requests alike (both count from 1); firing the same ids at once,
    each session gets only its own answers."""
    for name in sessions:
        await run(bridge, "await mcp_edge.echo(text='warm')", session=name, servers=["edge"])
    outs: dict[str, dict[str, list]] = {}

    async def fire(name: str) -> None:
        outs[name] = printed(await run(bridge, f"TAG = {name!r}\n" + IDS, session=name))

    async with anyio.create_task_group() as tg:
        for name in sessions:
            tg.start_soon(fire, name)
    a, b = (outs[name] for name in sessions)
    assert a["wrong"] == [] and b["wrong"] == []
    assert a["ids"] == b["ids"], "the two sessions did not use the same request ids"


BURST = """
import asyncio, json, time, mcp
started = time.monotonic()
results = await asyncio.gather(
    *(mcp_edge.echo(text=str(i)) for i in range(5000)), return_exceptions=True
)
answered = sum(
    1 for i, r in enumerate(results) if isinstance(r, dict) and r["content"][0]["text"] == str(i)
)
busy = sum(1 for r in results if isinstance(r, mcp.McpBusy))
other = [repr(r)[:200] for r in results if not isinstance(r, (dict, mcp.McpBusy))][:5]
after = await mcp_edge.echo(text="after the burst")
print(json.dumps({
    "answered": answered, "busy": busy, "other": other, "seconds": time.monotonic() - started,
    "after": after["content"][0]["text"], "in_flight": mcp._transport.connect().in_flight(),
}))
"""


async def test_a_burst_of_5000_requests_is_answered_or_refused(bridge: Client, sessions: list[str]) -> None:
    result = await run(bridge, BURST, session=sessions[0], servers=["edge"], timeout=120)
    out = printed(result)
    assert out["other"] == [] and out["answered"] + out["busy"] == 5000
    assert out["answered"] >= 64 and out["after"] == "after the burst" and out["in_flight"] == 0
    print(f"5000 requests at once: {out['answered']} answered, {out['busy']} busy in {out['seconds']:.1f} s")


KILLED = """
import mcp
try:
    await mcp_victim.wait(key="killed", seconds=120)
except mcp.McpServerError as exc:
    print("server_error:", exc)
"""


async def test_a_host_server_killed_mid_call_is_restarted_by_the_next_call(
    bridge: Client, sessions: list[str], host: HostConfig
) -> None:
    session = sessions[0]
    await run(bridge, "await mcp_victim.echo(text='warm')", session=session, servers=["victim"])
    outcome: list[object] = []

    async def cell() -> None:
        outcome.append(await run(bridge, KILLED, session=session, timeout=60))

    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cell)
            pid = int((await fate(host.edge_state, "killed", "started")).split()[1])
            os.kill(pid, signal.SIGKILL)
    (result,) = outcome
    stdout = result.structured_content["stdout"]  # type: ignore[attr-defined]
    assert stdout.startswith("server_error: server 'victim' exited during the call"), stdout
    assert "restarted on the next call" in stdout
    again = await run(bridge, "(await mcp_victim.pid())['structuredContent']['result']", session=session)
    new_pid = int(again.structured_content["result"])
    assert new_pid != pid and await anyio.Path(f"/proc/{new_pid}").exists()


IGNORES_INTERRUPT = """
import time
while True:
    try:
        time.sleep(100)
    except KeyboardInterrupt:
        pass
"""


async def test_proxies_are_bound_again_after_a_kernel_restart(bridge: Client, sessions: list[str]) -> None:
    session = sessions[0]
    await run(bridge, "x = 1", session=session, servers=["edge", "time"])
    lost = await run(bridge, IGNORES_INTERRUPT, session=session, timeout=2)
    assert lost.structured_content["state"] == "lost", text_of(lost)
    result = await run(
        bridge,
        "import json\nr = await mcp_edge.echo(text='rebound')\n"
        "print(json.dumps([r['content'][0]['text'], sorted(mcp_servers), 'x' in globals()]))",
        session=session,
    )
    assert printed(result) == ["rebound", ["edge", "time"], False]
