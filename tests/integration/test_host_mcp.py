"""Host MCP servers from sandbox code, end to end: an MCP client over stdio spawns ``kernelbridge
serve``; cells in real sandbox containers call real host servers (``mcp-server-time`` from PyPI,
``server-everything`` from npm, the project's edge server over stdio and streamable HTTP).

One bridge serves this module (its set-up is ``peers.host_bridge.write_host_config``); each test
uses a session of its own and closes it. Cells print one JSON line that the test reads back.
Every wait is bounded (``run`` and ``anyio.fail_after``).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import AsyncIterator

import anyio
import pytest
from mcp.client.client import Client
from peers.host_bridge import (
    EDGE,
    ENV_SECRET,
    EVERYTHING,
    EVERYTHING_SECRET,
    HEADER_SECRET,
    HostConfig,
    hidden,
    open_bridge,
    printed,
    run,
    text_of,
)

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

SERVERS = ["time", "everything", "victim", "edge", "edge-http", "dead"]
"""Every server of the set-up, in configuration order (no 'kernelbridge', no 'half')."""
KNOWN = "configured servers: " + ", ".join(SERVERS)
BRIDGE_SECRET = "bridge-only-" + "c0ffee"
"""In the bridge's own environment: must not reach sandboxes either."""


@pytest.fixture(scope="module")
async def bridge(host: HostConfig) -> AsyncIterator[Client]:
    async with open_bridge(
        host,
        KERNELBRIDGE_DENY_TOOLS="everything.get-env",
        KERNELBRIDGE_MAX_SESSIONS="12",
        KB_TEST_BRIDGE_SECRET=BRIDGE_SECRET,
    ) as client:
        yield client


@pytest.fixture
async def session(bridge: Client, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A session of this test's own, closed afterwards (its sandbox goes with it)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name.removeprefix("test_"))[:60]
    yield name
    with anyio.fail_after(60):
        await bridge.call_tool("close_session", {"session": name})


async def test_call_one_fetches_and_keeps_the_result_call_two_uses_it(bridge: Client, session: str) -> None:
    first = await run(
        bridge,
        "import json\nnow = await mcp_time.get_current_time(timezone='Europe/Paris')\nprint(json.dumps(now))",
        session=session,
        servers=["time"],
    )
    now = printed(first)
    assert set(now) == {"content", "structuredContent", "isError"} and now["isError"] is False
    assert now["structuredContent"]["timezone"] == "Europe/Paris"

    # No servers this time: the grant persists, and `now` is still in the kernel.
    second = await run(
        bridge,
        "hhmm = now['structuredContent']['datetime'][11:16]\n"
        "tokyo = await mcp_time.convert_time(source_timezone='Europe/Paris', time=hhmm,"
        " target_timezone='Asia/Tokyo')\n"
        "print(json.dumps({'hhmm': hhmm, 'tokyo': tokyo['structuredContent']}))",
        session=session,
    )
    used = printed(second)
    assert used["hhmm"] == now["structuredContent"]["datetime"][11:16]
    assert used["tokyo"]["source"]["timezone"] == "Europe/Paris"
    assert used["tokyo"]["target"]["timezone"] == "Asia/Tokyo"

    # A later call grants one more server: its proxy appears, the earlier one stays.
    third = await run(
        bridge,
        "total = await mcp_everything.get_sum(a=2, b=3)\n"
        "print(json.dumps({'names': sorted(k for k in globals() if k.startswith('mcp_')),"
        " 'granted': list(mcp_servers), 'listed': await runtime.list_servers(),"
        " 'sum': total['content'][0]['text']}))",
        session=session,
        servers=["everything"],
    )
    state = printed(third)
    assert state["names"] == ["mcp_everything", "mcp_servers", "mcp_time"]
    assert state["granted"] == state["listed"] == ["time", "everything"]
    assert "5" in state["sum"]


ACCESS_FORMS = """
import json, mcp
import mcp.runtime as rt
from mcp.servers.time import get_current_time
from mcp.servers.everything import echo as everything_echo
tz = {"timezone": "UTC"}
forms = {
    "mcp_alias": await mcp_time.get_current_time(**tz),
    "mcp_servers": await mcp_servers["time"].get_current_time(**tz),
    "module": await get_current_time(**tz),
    "mcp.runtime": await mcp.runtime.call_tool("time", "get_current_time", tz),
    "runtime": await runtime.call_tool("time", "get_current_time", tz),
    "import_runtime": await rt.call_tool("time", "get_current_time", tz),
    "call_tool_sync": runtime.call_tool_sync("time", "get_current_time", tz),
    "tool.sync": mcp_time.get_current_time.sync(**tz),
    "module.sync": everything_echo.sync(message="sync"),
    "tool_alias": await mcp_everything.get_sum(a=4, b=5),
    "real_name": await getattr(mcp_everything, "get-sum")(a=1, b=1),
    "runtime_real_name": await runtime.call_tool("everything", "get-sum", {"a": 2, "b": 2}),
}
helpers = {
    "list_servers": list(await runtime.list_servers()),
    "list_servers_sync": list(runtime.list_servers_sync()),
    "discovered_servers": list(runtime.discovered_servers()),
    "discovered_detailed": [[s["name"], s["granted"]] for s in runtime.discovered_servers(detailed=True)],
    "describe_server": sorted(runtime.describe_server("edge")),
    "list_tools": [t["name"] for t in await runtime.list_tools("time")],
    "list_tools_sync": [t["name"] for t in runtime.list_tools_sync("time")],
    "proxy_list_tools": [t["name"] for t in await mcp_time.list_tools()],
    "query_tool_docs": (await runtime.query_tool_docs("time", "get_current_time"))["description"],
    "query_tool_docs_sync": len(runtime.query_tool_docs_sync("everything")),
    "search_tool_docs": [h["tool"] for h in await runtime.search_tool_docs("current time", limit=1)],
    "search_tool_docs_sync": [h["tool"] for h in runtime.search_tool_docs_sync("current time", limit=1)],
    "list_loaded_server_metadata": [m["name"] for m in runtime.list_loaded_server_metadata()],
    "capability_summary": runtime.capability_summary(),
    "mcp_runtime_is_runtime": mcp.runtime is runtime,
    "same_function": mcp_time.get_current_time is mcp_servers["time"].get_current_time is get_current_time,
}
def brief(result):
    structured = result["structuredContent"] or {}
    return [result["isError"], structured.get("timezone"), result["content"][0].get("text", "")[:40]]
print(json.dumps({"forms": {k: brief(v) for k, v in forms.items()}, "helpers": helpers}))
"""


async def test_every_access_form(bridge: Client, session: str) -> None:
    result = printed(await run(bridge, ACCESS_FORMS, session=session, servers=["time", "everything"]))
    forms, helpers = result["forms"], result["helpers"]
    for name in ("mcp_alias", "mcp_servers", "module", "mcp.runtime", "runtime", "import_runtime"):
        assert forms[name][:2] == [False, "UTC"], name
    for name in ("call_tool_sync", "tool.sync"):
        assert forms[name][:2] == [False, "UTC"], name
    assert forms["module.sync"] == [False, None, "Echo: sync"]
    assert "9" in forms["tool_alias"][2] and "2" in forms["real_name"][2]
    assert "4" in forms["runtime_real_name"][2]
    assert helpers["list_servers"] == helpers["list_servers_sync"] == ["time", "everything"]
    assert helpers["discovered_servers"] == SERVERS
    assert helpers["discovered_detailed"] == [[name, name in ("time", "everything")] for name in SERVERS]
    assert helpers["describe_server"] == ["alias", "description", "granted", "name", "tools", "transport"]
    assert helpers["list_tools"] == helpers["list_tools_sync"] == helpers["proxy_list_tools"]
    assert set(helpers["list_tools"]) == {"get_current_time", "convert_time"}
    assert helpers["query_tool_docs"] == "Get current time in a specific timezone"
    assert helpers["query_tool_docs_sync"] > 5
    assert helpers["search_tool_docs"] == helpers["search_tool_docs_sync"] == ["get_current_time"]
    assert helpers["list_loaded_server_metadata"] == ["time", "everything"]
    assert "mcp_time" in helpers["capability_summary"] and "mcp_everything" in helpers["capability_summary"]
    assert helpers["mcp_runtime_is_runtime"] is True and helpers["same_function"] is True


SIGNATURES = """
import contextlib, inspect, io, json
def help_text(obj):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        help(obj)
    return buffer.getvalue()
print(json.dumps({
    "get_current_time": str(inspect.signature(mcp_time.get_current_time)),
    "convert_time": str(inspect.signature(mcp_time.convert_time)),
    "get_sum": str(inspect.signature(mcp_everything.get_sum)),
    "echo_sync": str(inspect.signature(mcp_everything.echo.sync)),
    "host_signature": runtime.query_tool_docs_sync("time", "convert_time", detail="full")["signature"],
    "help_tool": help_text(mcp_time.convert_time),
    "help_server": help_text(mcp_time),
    "doc": mcp_everything.get_sum.__doc__,
    "name": [mcp_everything.get_sum.__name__, mcp_everything.get_sum.server, mcp_everything.get_sum.tool],
}))
"""


async def test_signatures_and_help(bridge: Client, session: str) -> None:
    result = printed(await run(bridge, SIGNATURES, session=session, servers=["time", "everything"]))
    assert result["get_current_time"] == "(*, timezone: str) -> dict"
    convert = "(*, source_timezone: str, time: str, target_timezone: str) -> dict"
    assert result["convert_time"] == convert
    assert result["host_signature"] == "convert_time" + convert  # the host's docs say the same
    assert result["get_sum"] == "(*, a: float, b: float) -> dict"
    assert result["echo_sync"] == "(*, message: str) -> dict"
    assert "convert_time" + convert in result["help_tool"]
    assert "Convert time between timezones" in result["help_tool"]
    assert "source_timezone: str, required" in result["help_tool"]
    assert "get_current_time(*, timezone: str) -> dict" in result["help_server"]
    assert "convert_time(*, source_timezone" in result["help_server"]
    assert "Returns the sum of two numbers" in result["doc"]
    assert result["name"] == ["get_sum", "everything", "get-sum"]


NOT_GRANTED = """
import json, mcp
out = {}
try:
    mcp_servers["edge"]
except mcp.McpServerNotAvailable as exc:
    out["mcp_servers"] = str(exc)
try:
    await runtime.call_tool("edge", "echo", {"text": "x"})
except mcp.McpServerNotAvailable as exc:
    out["call_tool"] = str(exc)
try:
    runtime.call_tool_sync("edge-http", "echo", {"text": "x"})
except mcp.McpServerNotAvailable as exc:
    out["call_tool_sync"] = str(exc)
try:
    from mcp.servers.edge import echo
except ModuleNotFoundError as exc:
    out["import"] = str(exc)
out["names"] = sorted(k for k in globals() if k.startswith("mcp_"))
out["docs"] = runtime.query_tool_docs_sync("edge", "echo")["description"]
print(json.dumps(out))
"""


async def test_servers_not_granted_and_unknown(bridge: Client, session: str) -> None:
    out = printed(await run(bridge, NOT_GRANTED, session=session, servers=["time"]))
    assert out["call_tool"] == "Server 'edge' is not available"
    assert out["call_tool_sync"] == "Server 'edge-http' is not available"
    assert out["mcp_servers"].startswith("Server 'edge' is not available")
    assert "no server with alias 'edge' is granted to this session" in out["import"]
    assert out["names"] == ["mcp_servers", "mcp_time"]
    assert out["docs"] == "Return the text unchanged."  # docs cost no grant

    # An unknown name in servers=[...] is refused before anything runs, naming the known ones;
    # the self-launching entry and the malformed file's entry are not among them.
    for unknown in ("weather", "kernelbridge", "half"):
        refused = await run(bridge, "print('never')", session=session, servers=[unknown])
        assert refused.is_error is True
        assert text_of(refused).endswith(f"unknown server {unknown!r}; {KNOWN}")
    still = await run(bridge, "print(json.dumps(list(mcp_servers)))", session=session)
    assert printed(still) == ["time"]


DENIED = """
import json, mcp
out = {
    "attribute": hasattr(mcp_everything, "get_env"),
    "listed": "get-env" in [t["name"] for t in runtime.list_tools_sync("everything")],
    "searched": [h["tool"] for h in runtime.search_tool_docs_sync("environment variables", limit=50)],
}
for tool in ("get-env", "get_env"):
    try:
        await runtime.call_tool("everything", tool, {})
    except mcp.McpToolDenied as exc:
        out[tool] = [exc.kind, str(exc)]
print(json.dumps(out))
"""


async def test_a_tool_denied_by_the_operator(bridge: Client, session: str) -> None:
    out = printed(await run(bridge, DENIED, session=session, servers=["everything"]))
    assert out["attribute"] is False and out["listed"] is False
    assert "get-env" not in out["searched"]
    message = "Tool '{}' of server 'everything' is denied by the operator"
    assert out["get-env"] == ["denied", message.format("get-env")]
    assert out["get_env"] == ["denied", message.format("get_env")]


SEARCH = """
import json
print(json.dumps({
    "time": runtime.search_tool_docs_sync("current time", limit=5),
    "echo": [[h["server"], h["tool"], h["score"]] for h in await runtime.search_tool_docs("echo", limit=5)],
    "sum": [h["tool"] for h in runtime.search_tool_docs_sync("sum of two numbers", limit=3)],
    "typo": [h["tool"] for h in runtime.search_tool_docs_sync("convert timezne", limit=1)],
    "full": runtime.search_tool_docs_sync("convert time", limit=1, detail="full"),
}))
"""


async def test_search_is_ranked_best_first(bridge: Client, session: str) -> None:
    out = printed(await run(bridge, SEARCH, session=session))  # no grant needed for docs
    hits = out["time"]
    assert [hits[0]["server"], hits[0]["tool"]] == ["time", "get_current_time"]
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[1]
    assert {h[1] for h in out["echo"]} == {"echo"}  # every server's echo, nothing else first
    assert {h[0] for h in out["echo"]} >= {"everything", "edge", "victim"}
    assert out["sum"][0] == "get-sum"
    assert out["typo"] == ["convert_time"]
    (full,) = out["full"]
    assert full["tool"] == "convert_time" and full["signature"].startswith("convert_time(*, source_timezone")
    assert "input_schema" in full


async def test_config_problems_precedence_and_the_capabilities_resource(bridge: Client, session: str) -> None:
    out = printed(
        await run(
            bridge,
            "import json\nprint(json.dumps(runtime.discovered_servers(detailed=True)))",
            session=session,
        )
    )
    assert [s["name"] for s in out] == SERVERS
    described = {s["name"]: s for s in out}
    # time is defined in ~/MCPs and again with --servers-config: the later file wins.
    assert described["time"]["description"] == "Current time and timezone conversion"
    assert described["edge-http"]["transport"] == "http" and described["edge-http"]["alias"] == "edge_http"
    assert all(s["tools"] and "error" not in s for s in out if s["name"] != "dead")
    assert described["dead"]["tools"] == [] and described["dead"]["error"].startswith(
        "server 'dead' could not start"
    )

    with anyio.fail_after(30):
        resource = await bridge.read_resource("kernelbridge://capabilities")
    manual = "\n".join(getattr(c, "text", "") for c in resource.contents)
    for name in SERVERS:
        assert f"`{name}`" in manual
    assert "Current time and timezone conversion" in manual
    assert "~/MCPs/broken.json: not valid JSON" in manual
    assert "server 'kernelbridge': it would launch kernelbridge itself" in manual
    for secret in (ENV_SECRET, HEADER_SECRET, EVERYTHING_SECRET, "127.0.0.1", str(EDGE), sys.executable):
        assert secret not in manual
    assert str(EVERYTHING) not in manual and "node" not in manual.replace("nodes", "")
    assert len(manual) < 6000, "the manual is read by a model: keep it short"


REMOTE = """
import json
from mcp.servers.edge_http import length
echo = await mcp_edge_http.echo(text="over http")
size = await length(text="é" * 5_000_000)
huge = await mcp_servers["edge-http"].huge(n_bytes=10_000_000)
env = await mcp_edge_http.env(name="EDGE_SECRET")
print(json.dumps({
    "echo": echo["content"][0]["text"],
    "length": size["structuredContent"]["result"],
    "huge": len(huge["content"][0]["text"]),
    "env": env["structuredContent"]["result"],
    "granted": list(mcp_servers),
}))
"""


async def test_a_remote_streamable_http_server(bridge: Client, session: str) -> None:
    # Granted by its alias; 10 MB each way over HTTP.
    out = printed(await run(bridge, REMOTE, session=session, servers=["edge_http"]))
    assert out == {
        "echo": "over http",
        "length": 5_000_000,
        "huge": 10_000_000,
        "env": False,
        "granted": ["edge-http"],
    }


SECRETS = """
import json, os, mcp
from mcp import _transport
SECRETS = [s[::-1] for s in {secrets!r}]
hay = {{}}
with open("/proc/self/environ", "rb") as f:
    hay["/proc/self/environ"] = f.read().decode("utf-8", "replace")
hay["os.environ"] = json.dumps(dict(os.environ))
for pid in os.listdir("/proc"):
    for part in ("environ", "cmdline") if pid.isdigit() else ():
        try:
            with open(f"/proc/{{pid}}/{{part}}", "rb") as f:
                hay[f"/proc/{{pid}}/{{part}}"] = f.read().decode("utf-8", "replace")
        except OSError:
            pass
with open("/workspace/answers.json", "w") as f:
    f.write("written by the test")
for top in ("/workspace", "/tmp"):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    hay[path] = f.read(50_000_000).decode("utf-8", "replace")
            except OSError:
                pass
servers = [s for s in runtime.discovered_servers() if s != "dead"]
answers = [
    _transport.request("manifest", {{}}),
    _transport.request("discovered_servers", {{"detailed": True}}),
    [runtime.describe_server(s) for s in servers],
    [runtime.list_tools_sync(s) for s in servers],
    [runtime.query_tool_docs_sync(s, detail="full") for s in servers],
    runtime.search_tool_docs_sync("token secret authorization header environment", limit=50),
    runtime.list_loaded_server_metadata(),
    runtime.capability_summary(),
    repr(mcp_servers),
    [mcp_servers[s].__doc__ for s in mcp_servers],
    await mcp_edge.echo(text="x"),
    await mcp_edge_http.echo(text="x"),
]
has_env = (await mcp_edge.env(name="EDGE_" + "SECRET"))["structuredContent"]["result"]
hay["rpc results"] = json.dumps(answers, default=str)
found = sorted([where, i] for where, text in hay.items() for i, s in enumerate(SECRETS) if s in text)
print(json.dumps({{"found": found, "looked_in": len(hay), "server_has_env": has_env}}))
"""


async def test_host_server_secrets_never_reach_the_sandbox(
    bridge: Client, session: str, host: HostConfig
) -> None:
    secrets = [ENV_SECRET, HEADER_SECRET, EVERYTHING_SECRET, BRIDGE_SECRET, host.http_url, str(EDGE)]
    secrets += [str(EVERYTHING), sys.executable, str(host.home), str(host.env_file)]
    code = SECRETS.format(secrets=[hidden(s) for s in secrets])
    out = printed(await run(bridge, code, session=session, servers=SERVERS[:-1]))
    assert out["server_has_env"] is True  # the host server did get its secret ...
    assert out["found"] == []  # ... and nothing of it, nor of any other, is in the sandbox
    assert out["looked_in"] > 5


TOOL_CALLS = """
import json, mcp
ok = await mcp_time.get_current_time(timezone="UTC")
failed = await mcp_edge.fail()
try:
    await runtime.call_tool("everything", "get-env", {})
except mcp.McpToolDenied:
    pass
print(json.dumps([ok["isError"], failed["isError"]]))
"""


async def test_each_tool_call_is_recorded_in_the_notebook(bridge: Client, session: str) -> None:
    result = await run(bridge, TOOL_CALLS, session=session, servers=["time", "edge", "everything"])
    assert printed(result) == [False, True]
    calls = result.structured_content["tool_calls"]
    assert [(c["server"], c["tool"], c["ok"]) for c in calls] == [
        ("time", "get_current_time", True),
        ("edge", "fail", False),
        ("everything", "get-env", False),
    ]
    assert calls[2]["error"].startswith("denied: Tool 'get-env'")
    with anyio.fail_after(30):
        exported = await bridge.read_resource(f"kernelbridge://sessions/{session}/notebook")
    notebook = json.loads(exported.contents[0].text)  # type: ignore[union-attr]
    (cell,) = [c for c in notebook["cells"] if "mcp_edge.fail" in "".join(c["source"])]
    meta = cell["metadata"]["kernelbridge"]
    assert meta["servers"] == ["edge", "everything", "time"]
    recorded = meta["tool_calls"]
    assert [(c["server"], c["tool"], c["ok"], c["error"] is None) for c in recorded] == [
        ("time", "get_current_time", True, True),
        ("edge", "fail", False, True),
        ("everything", "get-env", False, False),
    ]
    assert all(isinstance(c["duration_ms"], int) and c["duration_ms"] >= 0 for c in recorded)
    assert recorded[0]["arguments"] == {"timezone": "UTC"}
    assert recorded[0]["result"]["structuredContent"]["timezone"] == "UTC"


DEAD = """
import json, mcp
out = {"repr": repr(mcp_dead), "summary": runtime.capability_summary(), "doc": mcp_dead.__doc__}
try:
    await mcp_dead.anything(x=1)
except mcp.McpServerError as exc:
    out["call"] = str(exc)
from mcp.servers.dead import whatever
try:
    whatever.sync()
except mcp.McpServerError as exc:
    out["import"] = str(exc)
print(json.dumps(out))
"""


async def test_a_granted_server_that_cannot_start_says_why_when_called(bridge: Client, session: str) -> None:
    out = printed(await run(bridge, DEAD, session=session, servers=["dead"]))
    assert out["repr"].startswith("<mcp server 'dead' as mcp_dead: tools unknown, the host could not list")
    assert "could not start" in out["doc"] and "mcp_dead ('dead': tools unknown" in out["summary"]
    for key in ("call", "import"):  # the host's reason, not "no tool 'anything'"
        assert out[key].startswith("server 'dead' could not start:"), out
        assert sys.executable not in out[key]


README_CALLS = [
    """
runtime.discovered_servers()
hits = runtime.search_tool_docs_sync("current time in a timezone", limit=3)
print([(h["server"], h["tool"]) for h in hits][:2])
help(mcp_time.get_current_time)
""",
    """
import asyncio
zones = ["Europe/Paris", "Asia/Tokyo", "America/New_York", "Australia/Sydney", "Asia/Kolkata"]
answers = await asyncio.gather(*(mcp_time.get_current_time(timezone=z) for z in zones))
now = {z: a["structuredContent"] for z, a in zip(zones, answers)}
""",
    """
sorted(z for z, t in now.items() if 9 <= int(t["datetime"][11:13]) < 18)
""",
]


async def test_the_readme_worked_example(bridge: Client, session: str) -> None:
    """The README's example, cell by cell, as a model would send it."""
    first, second, third = [
        await run(bridge, code, session=session, servers=["time"] if i == 0 else [])
        for i, code in enumerate(README_CALLS)
    ]
    stdout = first.structured_content["stdout"]
    assert stdout.startswith("[('time', 'get_current_time'), ('time', 'convert_time')]"), stdout
    assert "get_current_time(*, timezone: str) -> dict" in stdout
    assert second.structured_content["status"] == "ok" and second.structured_content["stdout"] == ""
    assert third.structured_content["status"] == "ok"
    working = ast.literal_eval(third.structured_content["result"])  # zone names, e.g. ['Asia/Tokyo']
    assert isinstance(working, list) and set(working) <= {
        "Europe/Paris",
        "Asia/Tokyo",
        "America/New_York",
        "Australia/Sydney",
        "Asia/Kolkata",
    }
