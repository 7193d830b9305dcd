"""The sandbox ``mcp`` package over a kernel's life: start, grant changes, no host, a host that goes
away, interrupts, and hostile or oversized answers on the rpc socket.

Each test that changes grants or breaks the channel gets its own kernel (sandbox_kernel_fixture);
the rest share one.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_kernel_fixture import FakeHost, SandboxKernel, sandbox_kernel

from kernelbridge import frames

INTERRUPT_BOUND = 10.0  # seconds from SIGINT to the end of the cell; a blocked wait must not outlast it


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxKernel]:
    with sandbox_kernel(tmp_path_factory.mktemp("kernel")) as k:
        assert k.refresh().status == "ok"
        yield k


def host_of(kernel: SandboxKernel) -> FakeHost:
    assert kernel.host is not None
    return kernel.host


def is_hold(request: dict) -> bool:  # type: ignore[type-arg]
    return request.get("method") == "call_tool" and request["params"].get("tool") == "hold"


def test_kernel_start_binds_the_api_hides_the_channel_and_calls_nothing(tmp_path: Path) -> None:
    with sandbox_kernel(tmp_path) as k:
        code = """
import os, subprocess, sys
from mcp import _transport
child_env = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.environ))"],
                           capture_output=True, text=True, timeout=30).stdout
{
    "bound": [name in globals() for name in ("mcp", "runtime", "save_tool", "mcp_servers")],
    "same": [runtime is mcp.runtime, save_tool is mcp.save_tool, mcp_servers is mcp.mcp_servers],
    "servers": dict(mcp_servers),
    "proxies": [name for name in globals() if name.startswith("mcp_") and name != "mcp_servers"],
    "variable": "KERNELBRIDGE_RPC_FD" in os.environ or "KERNELBRIDGE_RPC_FD" in child_env,
    "inheritable": os.get_inheritable(_transport.connect()._sock.fileno()),
    "who": get_ipython().run_line_magic("who_ls", ""),
}
"""
        out = k.value(code)
        assert out["bound"] == [True] * 4
        assert out["same"] == [True] * 3
        assert out["servers"] == {}
        assert out["proxies"] == []
        assert out["variable"] is False
        assert out["inheritable"] is False
        assert not {"mcp", "runtime", "save_tool", "mcp_servers"} & set(out["who"])
        # Nothing is fetched at start: no manifest before the host asks, no saved tool ever.
        assert host_of(k).requests == []


def test_refresh_binds_grants_and_unbinds_revoked_servers(tmp_path: Path) -> None:
    with sandbox_kernel(tmp_path) as k:
        host = host_of(k)
        host.granted = ["time"]
        host.skills["dormant"] = {
            "name": "dormant",
            "source": "raise SystemExit",
            "description": "",
            "saved_at": "x",
        }
        assert k.refresh().status == "ok"
        assert k.value(
            "sorted(mcp_servers), mcp_time.get_current_time.sync(timezone='A')['content'][0]['text']"
        ) == [
            ["time"],
            "12:00 in A",
        ]
        k.ok("from mcp.servers.time import get_current_time as kept")
        k.ok("mcp_mine = 'a user variable'\nservers = mcp_servers")

        # A server granted on a later call of the same session appears; the others stay.
        host.granted = ["time", "Secret Store"]
        assert k.refresh().status == "ok"
        code = """
from mcp.servers.secret_store import read
[sorted(mcp_servers), (await mcp_secret_store.read(key="k"))["structuredContent"]["arguments"],
 read is mcp_secret_store.read, servers is mcp_servers]
"""
        assert k.value(code) == [["Secret Store", "time"], {"key": "k"}, True, True]

        # A revoked server disappears everywhere; a user's own names survive; stale references are
        # refused by the host, not by a kernel-side secret.
        host.granted = ["Secret Store"]
        assert k.refresh().status == "ok"
        assert k.refresh().status == "ok"  # idempotent
        code = """
import sys
out = [sorted(mcp_servers), "mcp_time" in globals(), "mcp.servers.time" in sys.modules, mcp_mine]
try:
    from mcp.servers.time import get_current_time
except ImportError as exc:
    out.append(type(exc).__name__)
try:
    kept.sync(timezone="B")
except mcp.McpServerNotAvailable as exc:
    out.append(str(exc))
out
"""
        assert k.value(code) == [
            ["Secret Store"],
            False,
            False,
            "a user variable",
            "ModuleNotFoundError",
            "Server 'time' is not available",
        ]

        # Rebinding the API's names breaks nothing but the user's own use of them.
        k.ok("runtime = 5\nmcp_servers = None\ndel mcp")
        assert k.refresh().status == "ok"
        code = """
import mcp
[mcp.runtime.list_servers_sync(), sorted(mcp_servers), runtime]
"""
        assert k.value(code) == [["Secret Store"], ["Secret Store"], 5]
        assert host.calls("load_skill") == []  # saved tools never load by themselves


def test_without_a_host_every_call_says_so(tmp_path: Path) -> None:
    with sandbox_kernel(tmp_path, with_host=False) as k:
        code = """
out = []
calls = [
    lambda: runtime.list_tools_sync("x"),
    lambda: runtime.discovered_servers(),
    lambda: mcp._kernelbridge_refresh(),
    lambda: runtime.list_skills(),
    lambda: __import__("mcp.skills.anything"),
]
for call in calls:
    try:
        call()
    except mcp.McpUnavailable as exc:
        out.append(str(exc))
try:
    await runtime.call_tool("time", "get_current_time", {"timezone": "UTC"})
except mcp.McpUnavailable as exc:
    out.append(str(exc))
[out, dict(mcp_servers), runtime.capability_summary()]
"""
        messages, servers, summary = k.value(code)
        assert len(messages) == 6
        assert all(
            m.startswith("no host MCP servers in this kernel: it was not started by kernelbridge")
            for m in messages
        )
        assert servers == {}
        assert "No host MCP servers in this kernel" in summary
        refresh = k.refresh()
        assert refresh.status == "error" and (refresh.error or {}).get("ename") == "McpUnavailable"


def test_a_host_that_goes_away_fails_pending_and_later_calls(tmp_path: Path) -> None:
    with sandbox_kernel(tmp_path) as k:
        host = host_of(k)
        assert k.refresh().status == "ok"
        code = """
import asyncio, json, threading
caught = []
def blocked():
    try:
        mcp_my_server_2.hold.sync()
    except mcp.McpError as exc:
        caught.append([type(exc).__name__, str(exc)])
worker = threading.Thread(target=blocked)
worker.start()
results = await asyncio.gather(*(mcp_my_server_2.hold() for _ in range(3)), return_exceptions=True)
worker.join(30)
json.dumps([[type(r).__name__, str(r)] for r in results] + caught)
"""
        msg_id = k.start(code)
        deadline = time.monotonic() + 30
        while len([r for r in host.requests if is_hold(r)]) < 4:
            assert time.monotonic() < deadline, host.requests
            time.sleep(0.01)
        host.close()
        outcomes = k.collect(msg_id, timeout=15).value
        assert len(outcomes) == 4
        for name, message in outcomes:
            assert name == "McpUnavailable"
            assert message.startswith("the connection to the host closed: host MCP servers cannot be reached")
        code = """
try:
    mcp_time.get_current_time.sync(timezone="UTC")
except mcp.McpUnavailable as exc:
    message = str(exc)
message
"""
        assert k.value(code).startswith("the connection to the host closed")  # refused, not a timeout
        refresh = k.refresh()
        assert refresh.status == "error" and (refresh.error or {}).get("ename") == "McpUnavailable"
        assert k.value("1 + 1") == 2


def test_interrupting_a_blocked_sync_call_ends_the_cell_and_the_kernel_carries_on(
    kernel: SandboxKernel,
) -> None:
    host = host_of(kernel)
    msg_id = kernel.start("mcp_my_server_2.hold.sync()")
    host.wait_for(lambda r: is_hold(r) and r["cell"] == msg_id)
    kernel.interrupt()
    cell = kernel.collect(msg_id, timeout=INTERRUPT_BOUND)
    assert cell.status == "error" and (cell.error or {}).get("ename") == "KeyboardInterrupt", cell.describe()
    assert kernel.value("1 + 1") == 2
    # The host still answers the interrupted call; the kernel drops that late answer.
    host.release_held()
    code = """
from mcp import _transport
channel = _transport.connect()
import time
deadline = time.monotonic() + 10
while channel.dropped == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
after = mcp_time.get_current_time.sync(timezone="After")["content"][0]["text"]
[channel.dropped >= 1, channel.in_flight(), after]
"""
    assert kernel.value(code) == [True, 0, "12:00 in After"]


def test_malformed_answers_are_dropped_and_the_reader_lives_on(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    dropped_before = kernel.value("mcp._transport.connect().dropped")
    junk = [
        b"not json\n",
        b"[1, 2, 3]\n",
        b"\n",
        b'{"type": "rpc_response", "id": "seven", "result": {}}\n',
        b'{"type": "rpc_response", "id": true, "result": {}}\n',
        b'{"type": "rpc_response", "id": 987654321, "result": {}}\n',
        b'{"type": "kernel", "channel": "shell", "msg": {"header": {}}}\n',
        b'{"type": "rpc_response", "id": 5, "result": {}, "broken": \xff\xfe}\n',
        b"\xff\xfe\x00garbage without a newline yet",
        b" still garbage\n",
    ]
    for piece in junk:
        host.send_raw(piece)
    code = """
import time
channel = mcp._transport.connect()
deadline = time.monotonic() + 10
while channel.dropped < DROPPED and time.monotonic() < deadline:
    time.sleep(0.01)
[channel.dropped, channel.closed, mcp_time.get_current_time.sync(timezone="Still")["content"][0]["text"]]
""".replace("DROPPED", str(dropped_before + 9))
    dropped, closed, text = kernel.value(code)
    assert dropped == dropped_before + 9
    assert closed is None
    assert text == "12:00 in Still"


def test_an_answer_with_neither_result_nor_error_fails_its_call(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    msg_id = kernel.start("mcp_my_server_2.hold.sync()")
    request = host.wait_for(lambda r: is_hold(r) and r["cell"] == msg_id)
    host.send_raw(frames.encode({"type": frames.RPC_RESPONSE, "id": request["id"]}))
    cell = kernel.collect(msg_id)
    assert (cell.error or {}).get("ename") == "McpError"
    assert (cell.error or {}).get("evalue") == "the host sent an answer with neither result nor error"


def test_an_oversized_answer_is_dropped_and_fails_its_call(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    msg_id = kernel.start("mcp_my_server_2.hold.sync()")
    request = host.wait_for(lambda r: is_hold(r) and r["cell"] == msg_id)
    head = json.dumps({"type": "rpc_response", "id": request["id"]})[:-1].encode()
    body = b',"result":{"content":[{"type":"text","text":"' + b"x" * frames.MAX_RPC_BYTES + b'"}]}}\n'
    host.send_raw(head + body)
    cell = kernel.collect(msg_id)
    assert (cell.error or {}).get("ename") == "McpTooLarge", cell.describe()
    assert "exceeds the 33,554,432 byte limit" in (cell.error or {}).get("evalue", "")
    assert kernel.value("mcp_time.get_current_time.sync(timezone='Z')['content'][0]['text']") == "12:00 in Z"


def test_a_request_over_the_cap_is_refused_without_sending(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    before = len(host.requests)
    code = """
import kernelbridge.frames as f
try:
    await mcp_my_server_2.echo(message="x" * f.MAX_RPC_BYTES)
except mcp.McpTooLarge as exc:
    message = str(exc)
message
"""
    message = kernel.value(code)
    assert re.match(r"this request is 33,55\d,\d{3} bytes, over", message), message
    assert "over the 33,554,432 byte limit of a host MCP call" in message
    assert len(host.requests) == before


def test_a_cancelled_await_forgets_its_request(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    code = """
import asyncio
channel = mcp._transport.connect()
dropped = channel.dropped
try:
    await asyncio.wait_for(mcp_my_server_2.hold(), 0.2)
except asyncio.TimeoutError:
    timed_out = True
[timed_out, channel.in_flight(), dropped]
"""
    timed_out, in_flight, dropped = kernel.value(code)
    assert (timed_out, in_flight) == (True, 0)
    host.release_held()  # the host answers anyway: the kernel drops the answer
    code = """
import time
deadline = time.monotonic() + 10
while channel.dropped == DROPPED and time.monotonic() < deadline:
    time.sleep(0.01)
[channel.dropped > DROPPED, channel.closed]
""".replace("DROPPED", str(dropped))
    assert kernel.value(code) == [True, None]


NO_HOST = "no host MCP servers in this kernel: it was not started by kernelbridge"
ENTRY_POINTS = {
    # Never bound in a kernel without a host: NameError in the code, McpUnavailable where it is shown.
    "mcp_alias": "await mcp_time.get_current_time(timezone='UTC')",
    "mcp_alias_sync": "mcp_time.get_current_time.sync(timezone='UTC')",
    "mcp_servers": "await mcp_servers['time'].get_current_time(timezone='UTC')",
    "module": "from mcp.servers.time import get_current_time",
    "mcp.runtime": "import mcp\nawait mcp.runtime.call_tool('time', 'get_current_time', {'timezone': 'UTC'})",
    "runtime": "runtime.call_tool_sync('time', 'get_current_time', {'timezone': 'UTC'})",
    "runtime_async": "await runtime.list_tools('time')",
    "save_tool": "def greet(name):\n    return 'hi ' + name\nsave_tool(greet)",
    "skill": "from mcp.skills import greet",
    "runtime_deleted": "del runtime\nruntime.discovered_servers()",
}


def test_without_a_host_every_entry_point_fails_with_mcp_unavailable(tmp_path: Path) -> None:
    with sandbox_kernel(tmp_path, with_host=False) as k:
        for form, code in ENTRY_POINTS.items():
            cell = k.run(code)
            error = cell.error or {}
            assert cell.status == "error", (form, cell.describe())
            # The error the cell shows and the execute reply agree: McpUnavailable, one line.
            assert (error.get("ename"), cell.reply.get("ename")) == ("McpUnavailable", "McpUnavailable"), (
                form,
                cell.describe(),
            )
            assert error["evalue"] == cell.reply["evalue"] and "\n" not in error["evalue"], form
            assert error["evalue"].startswith(NO_HOST), (form, error["evalue"])
            # The user's line is the last frame shown: nothing of the mcp package.
            assert "kernelbridge/inside" not in cell.traceback and "skipping hidden" not in cell.traceback, (
                form,
                cell.traceback,
            )
        names = k.value("sorted(k for k in globals() if k.startswith('mcp'))")
        assert names == ["mcp", "mcp_servers"]  # nothing was bound along the way


def test_with_a_host_an_ungranted_proxy_name_says_how_to_grant_it(kernel: SandboxKernel) -> None:
    cell = kernel.run("await mcp_secret_store.read(key='k')")
    assert cell.status == "error" and cell.reply["ename"] == "NameError", cell.describe()
    assert (cell.error or {})["evalue"] == (
        "name 'mcp_secret_store' is not defined: no host MCP server with alias 'secret_store' is granted"
        " to this session (granted: my_server_2, time); grant it with run_python(servers=[...]);"
        " runtime.discovered_servers() lists every server"
    )
    for code in ("undefined_thing", "del runtime\nruntime"):  # not an API name, or a name the user deleted
        cell = kernel.run(code)
        assert cell.reply["ename"] == "NameError" and "granted" not in cell.reply["evalue"], cell.describe()
    kernel.ok("import mcp\nruntime = mcp.runtime")


def test_a_refused_call_shows_the_users_line_and_the_reason_only(kernel: SandboxKernel) -> None:
    for code, ename, last_line in (
        ("await mcp_time.get_current_time(tz='UTC')", "TypeError", "get_current_time() got an unexpected"),
        ("mcp_time.get_current_time.sync()", "TypeError", "get_current_time.sync() missing required"),
        ("await mcp_my_server_2.crash()", "McpServerError", "My-Server 2 crashed"),
        ("runtime.call_tool_sync('My-Server 2', 'nope', {})", "McpUnknownTool", "Server 'My-Server 2'"),
        ("def outer():\n    return mcp_my_server_2.crash.sync()\nouter()", "McpServerError", "My-Server 2"),
    ):
        cell = kernel.run(code)
        assert cell.status == "error" and cell.reply["ename"] == ename, cell.describe()
        shown = cell.traceback
        assert "kernelbridge/inside" not in shown and "skipping hidden" not in shown, shown
        assert shown.splitlines()[-1].startswith(f"{ename}: {last_line}"), shown
        assert code.splitlines()[-1] in shown, shown  # the user's line is there
