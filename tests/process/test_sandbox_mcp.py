"""The sandbox ``mcp`` package in a real kernel: access forms, signatures, errors, concurrency, helpers.

One kernel serves this module (state carries over between tests, so each test uses its own names);
the fake host at the rpc seam grants "My-Server 2" (alias my_server_2) and "time". Tests that
change grants or break the channel start their own kernel (test_sandbox_mcp_kernel.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_kernel_fixture import SandboxKernel, sandbox_kernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxKernel]:
    with sandbox_kernel(tmp_path_factory.mktemp("kernel")) as k:
        refreshed = k.refresh()
        assert refreshed.status == "ok", refreshed.describe()
        yield k


def host_of(kernel: SandboxKernel):  # type: ignore[no-untyped-def]
    assert kernel.host is not None
    return kernel.host


def test_the_kernel_imports_the_sandbox_package_not_the_sdk(kernel: SandboxKernel) -> None:
    path = kernel.value("import mcp\nmcp.__file__")
    assert Path(path) == Path(__file__).parents[2] / "kernelbridge/inside/pythonpath/mcp/__init__.py"


def test_every_access_form_calls_the_same_tool(kernel: SandboxKernel) -> None:
    code = """
r1 = await mcp_my_server_2.echo(message="attr")
r2 = await mcp_servers["My-Server 2"].echo(message="by name")
r3 = await mcp_servers["my_server_2"].echo(message="by alias")
from mcp.servers.my_server_2 import echo, import_
r4 = await echo(message="module")
r5 = await runtime.call_tool("My-Server 2", "echo", {"message": "runtime"})
import mcp.runtime as rt
from mcp import runtime as rt2
r6 = await rt.call_tool("my_server_2", "echo", {"message": "alias"})
r7 = await import_(module="os")
r8 = await getattr(mcp_my_server_2, "import")(module="sys")
same = echo is mcp_my_server_2.echo is mcp_servers["My-Server 2"].echo and rt is rt2 is runtime is mcp.runtime
[r["structuredContent"]["arguments"] for r in (r1, r2, r3, r4, r5, r6, r7, r8)] + [same, sorted(r1)]
"""
    *arguments, same, keys = kernel.value(code)
    assert [a.get("message", a.get("module")) for a in arguments] == [
        "attr", "by name", "by alias", "module", "runtime", "alias", "os", "sys"
    ]  # fmt: skip
    assert same is True
    assert keys == ["content", "isError", "structuredContent"]
    # The host receives real or alias names as the caller gave them, and the real tool name "import".
    calls = host_of(kernel).calls("call_tool")
    assert {(c["params"]["server"], c["params"]["tool"]) for c in calls} >= {
        ("My-Server 2", "echo"),
        ("my_server_2", "echo"),
        ("My-Server 2", "import"),
    }


def test_requests_carry_the_running_cell(kernel: SandboxKernel) -> None:
    msg_id = kernel.start("await mcp_time.get_current_time(timezone='Europe/Cell')")
    assert kernel.collect(msg_id).status == "ok"
    request = host_of(kernel).wait_for(lambda r: r["params"].get("arguments") == {"timezone": "Europe/Cell"})
    assert request["cell"] == msg_id
    assert isinstance(request["id"], int) and request["id"] > 0


def test_tool_proxies_are_real_functions_with_schema_signatures(kernel: SandboxKernel) -> None:
    code = """
import inspect
f = mcp_my_server_2.echo
info = {
    "signature": str(inspect.signature(f)),
    "sync_signature": str(inspect.signature(f.sync)),
    "isfunction": inspect.isfunction(f),
    "name": f.__name__, "qualname": f.__qualname__, "module": f.__module__,
    "real": [f.server, f.tool, mcp_my_server_2.import_.tool], "schema_keys": sorted(f.input_schema),
    "import_signature": str(inspect.signature(mcp_my_server_2.import_)),
    "fail_signature": str(inspect.signature(mcp_my_server_2.fail)),
    "repr": repr(mcp_my_server_2),
    "dir": dir(mcp_my_server_2),
    "server_doc": mcp_my_server_2.__doc__,
    "module_all": __import__("mcp.servers.my_server_2", fromlist=["x"]).__all__,
}
info
"""
    info = kernel.value(code)
    assert info["signature"] == (
        "(*, message: str, times: int = 1, mode: Optional[Literal['plain', 'upper']] = None,"
        " tags: Optional[list[str]] = None, options: Optional[dict] = None, ratio: Optional[float] = None,"
        " from_: Optional[str] = None, user_id: Optional[int] = None) -> dict"
    )
    assert info["sync_signature"] == info["signature"]
    assert info["isfunction"] is True
    assert (info["name"], info["qualname"], info["module"]) == ("echo", "echo", "mcp.servers.my_server_2")
    assert info["real"] == ["My-Server 2", "echo", "import"]
    assert info["schema_keys"] == ["properties", "required", "type"]
    assert info["import_signature"] == "(*, module: str) -> dict"
    assert info["fail_signature"] == "() -> dict"
    assert info["repr"] == (
        "<mcp server 'My-Server 2' as mcp_my_server_2: 7 tools: echo, import_, slow, fail, crash, big, hold>"
    )
    assert info["dir"] == ["big", "crash", "echo", "fail", "hold", "import_", "list_tools", "slow"]
    assert info["server_doc"].startswith(
        "Host MCP server 'My-Server 2', granted to this session as mcp_my_server_2."
    )
    assert "  import_(*, module: str) -> dict\n      Import a module by name." in info["server_doc"]
    assert info["module_all"] == ["echo", "import_", "slow", "fail", "crash", "big", "hold"]


def test_help_shows_description_then_parameters(kernel: SandboxKernel) -> None:
    text = kernel.ok("help(mcp_my_server_2.echo)").stdout
    assert "echo(*, message: str, times: int = 1," in text
    assert "Echo a message back.\n    \n    Second paragraph." in text
    assert (
        "Parameters (keyword-only):\n      message: str, required\n          The text to send back." in text
    )
    assert "from_: Optional[str] = None  (sent as 'from')\n          Who sends it." in text
    assert "await mcp_my_server_2.echo(message=...), or mcp_my_server_2.echo.sync(...) without await." in text
    server_help = kernel.ok("help(mcp_time)").stdout
    assert "get_current_time(*, timezone: str) -> dict" in server_help
    assert "Get the current time in a time zone." in server_help


def test_tab_completion_offers_tools_and_parameters(kernel: SandboxKernel) -> None:
    def complete(code: str) -> list[str]:
        msg_id = kernel.client.complete(code, len(code))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reply = kernel.client.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]["matches"]
        raise AssertionError("no complete_reply")

    assert "echo" in complete("mcp_my_server_2.ec")  # matches replace the text after the dot
    assert "message=" in complete("mcp_my_server_2.echo(mes")


def test_arguments_are_checked_before_anything_is_sent(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    before = len(host.calls("call_tool"))
    code = """
errors = []
for call in (
    lambda: mcp_my_server_2.echo(message="m", colour="red"),
    lambda: mcp_my_server_2.echo("positional"),
    lambda: mcp_my_server_2.echo(times=2),
    lambda: mcp_my_server_2.echo.sync(message="m", colour="red"),
    lambda: mcp_my_server_2.echo(message="m", from_="a", **{"from": "b"}),
):
    try:
        call()
    except TypeError as exc:
        errors.append(str(exc))
errors
"""
    assert kernel.value(code) == [
        "echo() got an unexpected keyword argument 'colour' (it takes: message, times, mode, tags, options,"
        " ratio, from_, user_id)",
        "echo() takes keyword arguments only (1 positional given); call it as echo(message=...)",
        "echo() missing required keyword argument: 'message'",
        "echo.sync() got an unexpected keyword argument 'colour' (it takes: message, times, mode, tags,"
        " options, ratio, from_, user_id)",
        "echo() got multiple values for argument 'from'",
    ]
    assert len(host.calls("call_tool")) == before


def test_only_given_arguments_are_sent_under_their_real_names(kernel: SandboxKernel) -> None:
    code = """
a = await mcp_my_server_2.echo(message="only")
b = await mcp_my_server_2.echo(message="none", mode=None, tags=None, ratio=None)
c = await mcp_my_server_2.echo(message="names", from_="me", user_id=7, tags=["x"], options={"k": 1})
d = await mcp_my_server_2.echo(message="wire", **{"from": "you", "user-id": 8})
[r["structuredContent"]["arguments"] for r in (a, b, c, d)]
"""
    assert kernel.value(code) == [
        {"message": "only"},  # times (default 1) left out: the server applies its own default
        {"message": "none", "ratio": None},  # None = "left out", unless the schema admits null
        {"message": "names", "from": "me", "user-id": 7, "tags": ["x"], "options": {"k": 1}},
        {"message": "wire", "from": "you", "user-id": 8},
    ]


def test_a_tool_error_is_returned_and_a_failed_call_raises(kernel: SandboxKernel) -> None:
    code = """
failed = await mcp_my_server_2.fail()
try:
    await mcp_my_server_2.crash()
except mcp.McpServerError as exc:
    crash = [type(exc).__name__, exc.kind, str(exc), isinstance(exc, mcp.McpError)]
failed, crash
"""
    failed, crash = kernel.value(code)
    assert failed == {
        "content": [{"type": "text", "text": "it failed"}],
        "structuredContent": None,
        "isError": True,
    }
    assert crash == ["McpServerError", "server_error", "My-Server 2 crashed: connection reset by peer", True]
    cell = kernel.run("await mcp_my_server_2.crash()")
    assert cell.status == "error"
    assert (cell.error or {}).get("ename") == "McpServerError"
    # None of the package's frames is in the traceback (not even where it was raised): the user's
    # line is the last frame shown (kernelbridge/inside/kernel/shell.py).
    assert "pythonpath/mcp/" not in cell.traceback and "skipping hidden" not in cell.traceback, cell.traceback
    assert cell.traceback.splitlines()[-1] == "McpServerError: My-Server 2 crashed: connection reset by peer"


def test_error_kinds_map_to_exception_classes(kernel: SandboxKernel) -> None:
    code = """
from mcp._errors import error_from_response
kinds = ["not_available", "denied", "unknown_tool", "invalid_params", "too_large", "busy", "cancelled",
         "server_error", "unavailable", "internal", "something_new"]
errors = [error_from_response({"kind": k, "message": "m"}) for k in kinds]
subclasses = (mcp.McpServerNotAvailable, mcp.McpInvalidParams, mcp.McpUnavailable)
[[type(e).__name__, e.kind, str(e)] for e in errors] + [
    [issubclass(c, mcp.McpError) for c in subclasses],
    [issubclass(mcp.McpInvalidParams, TypeError), issubclass(mcp.McpServerNotAvailable, KeyError)],
    str(error_from_response("junk")), runtime.MCPError is mcp.McpError]
"""
    *mapped, base, builtins, junk, alias = kernel.value(code)
    assert [m[0] for m in mapped] == [
        "McpServerNotAvailable", "McpToolDenied", "McpUnknownTool", "McpInvalidParams", "McpTooLarge",
        "McpBusy", "McpCancelled", "McpServerError", "McpUnavailable", "McpError", "McpError",
    ]  # fmt: skip
    assert mapped[-1][1] == "something_new"
    assert base == [True, True, True] and builtins == [True, True]
    assert junk == "the host sent a malformed error answer"
    assert alias is True


def test_not_granted_servers_are_refused_clearly(kernel: SandboxKernel) -> None:
    code = """
out = []
try:
    await runtime.call_tool("Secret Store", "read", {"key": "k"})
except mcp.McpServerNotAvailable as exc:
    out.append([type(exc).__name__, str(exc)])
try:
    mcp_servers["Secret Store"]
except KeyError as exc:
    out.append([type(exc).__name__, str(exc)])
try:
    from mcp.servers.secret_store import read
except ImportError as exc:
    out.append([type(exc).__name__, str(exc)])
try:
    await runtime.call_tool("time", "no_such_tool")
except mcp.McpUnknownTool as exc:
    out.append([type(exc).__name__, str(exc)])
try:
    mcp_time.no_such_tool
except AttributeError as exc:
    out.append([type(exc).__name__, str(exc)])
out.append("mcp_secret_store" in dir())
out
"""
    call, lookup, module, unknown, attribute, bound = kernel.value(code)
    assert call == ["McpServerNotAvailable", "Server 'Secret Store' is not available"]
    assert lookup[0] == "McpServerNotAvailable"
    assert lookup[1].startswith("Server 'Secret Store' is not available: it is not granted to this session")
    assert module[0] == "ModuleNotFoundError"
    assert "no server with alias 'secret_store' is granted to this session" in module[1]
    assert "run_python(servers=[...])" in module[1]
    assert unknown == ["McpUnknownTool", "Server 'time' has no tool 'no_such_tool'"]
    assert attribute[1].startswith(
        "host MCP server 'time' has no tool 'no_such_tool' (its tools: get_current_time)"
    )
    assert bound is False


def test_invalid_arguments_from_the_host_and_unserializable_ones(kernel: SandboxKernel) -> None:
    code = """
out = []
try:
    await runtime.call_tool("time", "get_current_time", {"timezone": object()})
except TypeError as exc:
    out.append([type(exc).__name__, isinstance(exc, mcp.McpError), str(exc)[:45]])
try:
    runtime.call_tool_sync("time", "get_current_time", ["not", "a", "dict"])
except TypeError as exc:
    out.append([type(exc).__name__, str(exc)])
out
"""
    unserializable, not_a_dict = kernel.value(code)
    assert unserializable == ["McpInvalidParams", True, "arguments must be JSON-serializable: Object o"]
    assert not_a_dict == ["TypeError", "arguments must be a dict of the tool's parameters, not list"]


def test_twenty_calls_in_flight_at_once(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    # Later calls answer sooner: the answers come back in reverse order and must still match.
    code = """
import asyncio
calls = [mcp_my_server_2.slow(seconds=0.6 - i * 0.02, tag=f"t{i}") for i in range(20)]
results = await asyncio.gather(*calls)
[r["content"][0]["text"] for r in results]
"""
    assert kernel.value(code) == [f"t{i}" for i in range(20)]
    assert host.max_in_flight >= 20  # all at once, not one after the other


def test_a_ten_megabyte_result_arrives_whole(kernel: SandboxKernel) -> None:
    code = """
r = await mcp_my_server_2.big(size=10_000_000)
[len(r["content"][0]["text"]), sorted(set(r["content"][0]["text"]))]
"""
    assert kernel.value(code) == [10_000_000, ["x"]]


def test_sync_helpers_work_from_plain_code(kernel: SandboxKernel) -> None:
    code = """
import threading
def plain():
    return mcp_time.get_current_time.sync(timezone="Plain/Function")["content"][0]["text"]
from_thread = []
def in_thread():
    from_thread.append(runtime.call_tool_sync("time", "get_current_time", {"timezone": "T/Thread"}))
worker = threading.Thread(target=in_thread)
worker.start(); worker.join(30)
out = {
    "plain": plain(),
    "thread": from_thread[0]["content"][0]["text"],
    "discovered": runtime.discovered_servers(),
    "detailed": [s["alias"] for s in runtime.discovered_servers(detailed=True)],
    "granted_flags": [s["granted"] for s in runtime.discovered_servers(detailed=True)],
    "describe": sorted(runtime.describe_server("time")),
    "tools": [t["alias"] for t in runtime.list_tools_sync("My-Server 2")],
    "doc_one": runtime.query_tool_docs_sync("my_server_2", "import"),
    "docs_all": len(runtime.query_tool_docs_sync("My-Server 2")),
    "doc_full": sorted(runtime.query_tool_docs_sync("time", "get_current_time", detail="full")),
    "docs_not_granted": runtime.query_tool_docs_sync("Secret Store")[0]["tool"],
    "search": [h["tool"] for h in runtime.search_tool_docs_sync("time zone", limit=2)],
    "search_full": "input_schema" in runtime.search_tool_docs_sync("echo", detail="full")[0],
    "servers_sync": runtime.list_servers_sync(),
    "loaded": [m["alias"] for m in runtime.list_loaded_server_metadata()],
    "summary": runtime.capability_summary(),
}
out
"""
    out = kernel.value(code)
    assert out["plain"] == "12:00 in Plain/Function"
    assert out["thread"] == "12:00 in T/Thread"
    assert out["discovered"] == ["My-Server 2", "time", "Secret Store"]
    assert out["detailed"] == ["my_server_2", "time", "secret_store"]
    assert out["granted_flags"] == [True, True, False]
    assert out["describe"] == ["alias", "description", "granted", "name", "tools", "transport"]
    assert out["tools"] == ["echo", "import_", "slow", "fail", "crash", "big", "hold"]
    assert out["doc_one"] == {
        "server": "My-Server 2",
        "tool": "import",
        "alias": "import_",
        "description": "Import a module by name.",
    }
    assert out["docs_all"] == 7
    assert out["doc_full"] == [
        "alias",
        "description",
        "input_schema",
        "output_schema",
        "server",
        "signature",
        "tool",
    ]
    assert out["docs_not_granted"] == "read"
    assert out["search"] == ["get_current_time"]
    assert out["search_full"] is True
    assert out["servers_sync"] == ["My-Server 2", "time"]
    assert out["loaded"] == ["my_server_2", "time"]
    summary = out["summary"]
    assert "mcp_my_server_2 ('My-Server 2': echo, import_, slow, fail, crash, big, hold)" in summary
    assert "await mcp_<alias>.<tool>(arg=...)" in summary
    assert "runtime.search_tool_docs_sync('words')" in summary
    assert "from mcp.skills import <name>" in summary
    assert len(summary) < 1600


def test_async_helpers(kernel: SandboxKernel) -> None:
    code = """
out = [
    await runtime.list_servers(),
    [t["name"] for t in await runtime.list_tools("time")],
    (await runtime.query_tool_docs("time", "get_current_time", detail="full"))["signature"],
    [h["tool"] for h in await runtime.search_tool_docs("echo", limit=1)],
    [t["alias"] for t in await mcp_time.list_tools()],
]
out
"""
    assert kernel.value(code) == [
        ["My-Server 2", "time"],
        ["get_current_time"],
        "get_current_time(...)",
        ["echo"],
        ["get_current_time"],
    ]


def test_helper_arguments_are_checked(kernel: SandboxKernel) -> None:
    code = """
out = []
for call in (lambda: runtime.query_tool_docs_sync("time", detail="everything"),
             lambda: runtime.search_tool_docs_sync("x", limit=0),
             lambda: runtime.list_tools_sync(None)):
    try:
        call()
    except (TypeError, ValueError) as exc:
        out.append(str(exc))
out
"""
    assert kernel.value(code) == [
        'detail must be "summary" or "full", not \'everything\'',
        "limit must be an integer from 1 to 50, not 0",
        "server must be a non-empty string (a name or an alias), not None",
    ]


def test_save_tool_then_import_it_from_skills(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    saved = kernel.value(
        '''
def shout(text: str) -> str:
    """Upper-case text and add an exclamation mark."""
    return text.upper() + "!"

save_tool(shout)
'''
    )
    assert saved == "saved tool 'shout'; later sessions load it with: from mcp.skills import shout"
    assert host.skills["shout"]["source"] == (
        'def shout(text: str) -> str:\n    """Upper-case text and add an exclamation mark."""\n'
        '    return text.upper() + "!"\n'
    )
    assert host.skills["shout"]["description"] == "Upper-case text and add an exclamation mark."
    assert not host.calls("load_skill")  # saving never loads anything
    code = """
del shout
from mcp.skills import shout
import inspect
first_line = inspect.getsource(shout).splitlines()[0]
[shout("hi"), shout.__module__, first_line, [s["name"] for s in runtime.list_skills()]]
"""
    assert kernel.value(code) == ["HI!", "mcp.skills.shout", "def shout(text: str) -> str:", ["shout"]]
    assert len(host.calls("load_skill")) == 1


def test_saved_tools_see_the_sandbox_api_and_reload_after_saving_again(kernel: SandboxKernel) -> None:
    code = """
def local_time(zone):
    return mcp_time.get_current_time.sync(timezone=zone)["content"][0]["text"]
save_tool(local_time)
from mcp.skills import local_time as loaded
first = loaded("Skill/Zone")
def local_time(zone):
    return "v2 " + zone
again = save_tool(local_time)
from mcp.skills import local_time as reloaded
[first, again, reloaded("z")]
"""
    assert kernel.value(code) == [
        "12:00 in Skill/Zone",
        "replaced the earlier version of tool 'local_time'; later sessions load it with:"
        " from mcp.skills import local_time",
        "v2 z",
    ]


def test_save_tool_refuses_what_it_cannot_save_and_unknown_skills_fail_to_import(
    kernel: SandboxKernel,
) -> None:
    code = """
def outer():
    x = 1
    def inner():
        return x
    return inner
out = []
for thing in (lambda: 1, print, outer()):
    try:
        save_tool(thing)
    except TypeError as exc:
        out.append(str(exc))
try:
    from mcp.skills import never_saved
except ImportError as exc:
    out.append([type(exc).__name__, str(exc)])
out
"""
    lam, builtin, closure, missing = kernel.value(code)
    assert lam == "save_tool() needs a function with a public name, not '<lambda>' (define it with def)"
    assert builtin == "save_tool() expects a function defined with def, not builtin_function_or_method"
    assert closure.startswith(
        "save_tool() saves top-level functions only: inner() uses variables of an enclosing"
    )
    assert missing[0] == "ModuleNotFoundError"
    assert missing[1].startswith("No saved tool named 'never_saved' (No saved tool named 'never_saved');")


def test_signatures_of_unusual_schemas(kernel: SandboxKernel) -> None:
    code = """
from mcp._signature import tool_signature
array_of_objects = {"type": "array", "items": {"type": "object"}}
schemas = [
    None,
    ["not", "a", "schema"],
    {"type": "object"},
    {"properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, "required": ["x"]},
    {"type": "object", "properties": {"kind": {"const": "a"}, "level": {"enum": ["low", None]}}},
    {"type": "object", "properties": {"class": {"type": "string"}, "2fast": {}, "a-b": {}, "a_b": {}}},
    {"type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": True},
    {"properties": {"n": {"type": "integer", "default": 5}, "items": array_of_objects}},
]
[str(tool_signature(s).signature) for s in schemas]
"""
    assert kernel.value(code) == [
        "() -> dict",
        "() -> dict",
        "() -> dict",
        "(*, x: Union[str, int]) -> dict",
        "(*, kind: Optional[Literal['a']] = None, level: Literal['low', None] = None) -> dict",
        "(*, class_: Optional[str] = None, _2fast: Any = None, a_b: Any = None, **kwargs: Any) -> dict",
        "(*, q: Optional[str] = None, **kwargs: Any) -> dict",
        "(*, n: int = 5, items: Optional[list[dict]] = None) -> dict",
    ]


def test_a_save_tool_decorator_is_not_saved_with_the_source(kernel: SandboxKernel) -> None:
    host = host_of(kernel)
    kernel.ok("@save_tool\ndef twice(x):\n    return 2 * x")
    assert host.skills["twice"]["source"] == "def twice(x):\n    return 2 * x\n"
    saves = len(host.calls("save_tool"))
    assert kernel.value("from mcp.skills import twice\ntwice(21)") == 42
    assert len(host.calls("save_tool")) == saves  # loading a skill never saves it again
