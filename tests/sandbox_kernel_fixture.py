"""A local ipykernel started the way the sandbox agent starts it, with a fake host on its rpc socket.

The sandbox ``mcp`` package (``kernelbridge/inside/pythonpath/mcp``) must never be imported in the
test process, where ``mcp`` is the real MCP SDK: it is exercised inside a real kernel subprocess:

- ``python -m ipykernel_launcher -f <connection file>`` with the agent's own flags
  (``kernelbridge.inside.agent.kernel_process.kernel_argv``: the kernel class, the capped out
  stream, the extensions ``kernelbridge.inside.kernel.bounded_history`` and ``mcp._ipython``);
- ``PYTHONPATH=<repo>/kernelbridge/inside/pythonpath:<repo>`` (in the image: ``/opt/kernelbridge``);
- ``KERNELBRIDGE_RPC_FD=<fd>``, one end of a ``socket.socketpair()`` passed with ``pass_fds``.

:class:`FakeHost` serves the other end: a scripted implementation of the methods of docs/rpc.md
with a few fake servers (the real hub is another layer's; this is a test double at the seam).
:class:`SandboxKernel` runs cells through a jupyter_client BlockingKernelClient; every wait is bounded.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from kernelbridge import frames
from kernelbridge.inside.agent.kernel_process import PYTHONPATH_DIR, kernel_argv

REPO = Path(__file__).resolve().parents[1]
REFRESH_CODE = "import mcp; mcp._kernelbridge_refresh()"
KERNEL_READY_TIMEOUT = 60.0  # two cores shared with other test runs: a cold start can take seconds
CELL_TIMEOUT = 30.0
SHUTDOWN_TIMEOUT = 3.0  # a kernel exits ~0.3 s after shutdown_request


# -- the fake host -------------------------------------------------------------------------------------
def _schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or []}


ECHO_SCHEMA = _schema(
    {
        "message": {"type": "string", "description": "The text to send back."},
        "times": {"type": "integer", "default": 1, "description": "How often to repeat it."},
        "mode": {"type": "string", "enum": ["plain", "upper"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "options": {"type": "object"},
        "ratio": {"type": ["number", "null"]},
        "from": {"type": "string", "description": "Who sends it."},
        "user-id": {"type": "integer"},
    },
    ["message"],
)


def _tool(name: str, alias: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "alias": alias, "description": description, "input_schema": schema}


SERVERS: dict[str, dict[str, Any]] = {
    "My-Server 2": {
        "alias": "my_server_2",
        "description": "A fake server with awkward names.",
        "tools": [
            _tool("echo", "echo", "Echo a message back.\n\nSecond paragraph.", ECHO_SCHEMA),
            _tool(
                "import",
                "import_",
                "Import a module by name.",
                _schema({"module": {"type": "string"}}, ["module"]),
            ),
            _tool(
                "slow",
                "slow",
                "Answer after a delay.",
                _schema({"seconds": {"type": "number"}, "tag": {"type": "string"}}, ["seconds"]),
            ),
            _tool("fail", "fail", "Always reports a tool error.", _schema({})),
            _tool("crash", "crash", "The server crashes.", _schema({})),
            _tool(
                "big", "big", "Return size bytes of text.", _schema({"size": {"type": "integer"}}, ["size"])
            ),
            _tool("hold", "hold", "Never answers until the test releases it.", _schema({})),
        ],
    },
    "time": {
        "alias": "time",
        "description": "Time and time zones.",
        "tools": [
            _tool(
                "get_current_time",
                "get_current_time",
                "Get the current time in a time zone.",
                _schema(
                    {"timezone": {"type": "string", "description": "IANA time zone name."}}, ["timezone"]
                ),
            )
        ],
    },
    "Secret Store": {
        "alias": "secret_store",
        "description": "Granted only by some tests.",
        "tools": [_tool("read", "read", "Read a secret.", _schema({"key": {"type": "string"}}, ["key"]))],
    },
}


class RpcFault(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass
class FakeHost:
    """Serves one socket end with scripted answers to docs/rpc.md requests, in a daemon thread."""

    sock: socket.socket
    granted: list[str] = field(default_factory=lambda: ["My-Server 2", "time"])
    skills: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    max_in_flight: int = 0
    answers_sent: int = 0

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._in_flight = 0
        self._held: list[int] = []
        self._timers: list[threading.Timer] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fake-host", daemon=True)
        self._thread.start()

    # -- what tests use ------------------------------------------------------------------------
    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = CELL_TIMEOUT
    ) -> dict[str, Any]:
        """The first recorded request matching ``predicate``, waiting for it up to ``timeout``."""
        with self._cond:
            found: list[dict[str, Any]] = []

            def match() -> bool:
                found[:] = [r for r in self.requests if predicate(r)][:1]
                return bool(found)

            if not self._cond.wait_for(match, timeout):
                raise AssertionError(f"no matching rpc request within {timeout} s: {self.requests[-5:]}")
            return found[0]

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self._cond:
            return [r for r in self.requests if r.get("method") == method]

    def release_held(self) -> None:
        with self._cond:
            held, self._held = self._held, []
        for request_id in held:
            self.answer(request_id, result=_text_result("released"))

    def send_raw(self, data: bytes) -> None:
        with self._write_lock:
            self.sock.sendall(data)

    def answer(self, request_id: int, result: Any = None, error: dict[str, str] | None = None) -> None:
        frame: dict[str, Any] = {"type": frames.RPC_RESPONSE, "id": request_id}
        if error is not None:
            frame["error"] = error
        else:
            frame["result"] = result
        try:
            self.send_raw(frames.encode(frame))
        except OSError:
            return  # the kernel went away; its calls are over anyway
        with self._cond:
            self._in_flight -= 1
            self.answers_sent += 1

    def close(self) -> None:
        """Close the host end, as if the session closed or the agent died."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)

    # -- serving -------------------------------------------------------------------------------
    def _serve(self) -> None:
        decoder = frames.FrameDecoder(frames.MAX_RPC_BYTES)
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            for frame in decoder.feed(data):
                if isinstance(frame, frames.FrameError) or frame.get("type") != frames.RPC_REQUEST:
                    continue
                with self._cond:
                    self.requests.append(frame)
                    self._in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self._in_flight)
                    self._cond.notify_all()
                self._handle(frame)

    def _handle(self, frame: dict[str, Any]) -> None:
        request_id = frame["id"]
        try:
            method = getattr(self, f"_m_{frame['method']}")
            result = method(request_id, **frame["params"])
        except RpcFault as fault:
            self.answer(request_id, error={"kind": fault.kind, "message": fault.message})
            return
        except TypeError as exc:
            self.answer(request_id, error={"kind": "invalid_params", "message": str(exc)})
            return
        if result is not _LATER:
            self.answer(request_id, result=result)

    def _server(self, name: str, granted_only: bool = False) -> tuple[str, dict[str, Any]]:
        for real, server in SERVERS.items():
            if name in (real, server["alias"]) and (not granted_only or real in self.granted):
                return real, server
        raise RpcFault("not_available", f"Server {name!r} is not available")

    def _summary(self, name: str) -> dict[str, Any]:
        server = SERVERS[name]
        return {
            "name": name,
            "alias": server["alias"],
            "description": server["description"],
            "granted": name in self.granted,
            "transport": "stdio",
        }

    def _record(self, name: str) -> dict[str, Any]:
        return {**self._summary(name), "tools": SERVERS[name]["tools"]}

    def _m_manifest(self, request_id: int) -> Any:
        return {"servers": [self._record(name) for name in self.granted]}

    def _m_list_servers(self, request_id: int) -> Any:
        return {"servers": list(self.granted)}

    def _m_discovered_servers(self, request_id: int, detailed: bool) -> Any:
        return {"servers": [self._summary(name) for name in SERVERS]}

    def _m_describe_server(self, request_id: int, server: str) -> Any:
        return self._record(self._server(server)[0])

    def _m_list_tools(self, request_id: int, server: str) -> Any:
        return {"tools": self._server(server)[1]["tools"]}

    def _doc(self, server: str, tool: dict[str, Any], detail: str) -> dict[str, Any]:
        doc = {
            "server": server,
            "tool": tool["name"],
            "alias": tool["alias"],
            "description": tool["description"].splitlines()[0],
        }
        if detail == "full":
            doc |= {
                "input_schema": tool["input_schema"],
                "output_schema": None,
                "signature": f"{tool['alias']}(...)",
            }
        return doc

    def _m_query_tool_docs(self, request_id: int, server: str, tool: str | None, detail: str) -> Any:
        real, record = self._server(server)
        tools = [t for t in record["tools"] if tool in (None, t["name"], t["alias"])]
        if not tools:
            raise RpcFault("unknown_tool", f"Server {real!r} has no tool {tool!r}")
        return {"docs": [self._doc(real, t, detail) for t in tools]}

    def _m_search_tool_docs(self, request_id: int, query: str, limit: int = 5) -> Any:
        hits = []
        words = query.lower().split()
        for real, record in SERVERS.items():
            for tool in record["tools"]:
                text = f"{tool['name']} {tool['description']}".lower()
                score = float(sum(word in text for word in words))
                if score:
                    hits.append({**self._doc(real, tool, "summary"), "score": score})
        hits.sort(key=lambda hit: -hit["score"])
        return {"results": hits[:limit]}

    def _m_call_tool(self, request_id: int, server: str, tool: str, arguments: dict[str, Any]) -> Any:
        real, record = self._server(server, granted_only=True)
        if tool not in [t["name"] for t in record["tools"]]:
            raise RpcFault("unknown_tool", f"Server {real!r} has no tool {tool!r}")
        if tool == "slow":
            timer = threading.Timer(
                arguments["seconds"],
                self.answer,
                (request_id,),
                {"result": _text_result(arguments.get("tag", ""))},
            )
            timer.daemon = True
            self._timers.append(timer)
            timer.start()
            return _LATER
        if tool == "hold":
            with self._cond:
                self._held.append(request_id)
            return _LATER
        if tool == "fail":
            return {
                "content": [{"type": "text", "text": "it failed"}],
                "structuredContent": None,
                "isError": True,
            }
        if tool == "crash":
            raise RpcFault("server_error", "My-Server 2 crashed: connection reset by peer")
        if tool == "big":
            return _text_result("x" * arguments["size"])
        if tool == "get_current_time":
            return _text_result(f"12:00 in {arguments['timezone']}")
        return {
            "content": [{"type": "text", "text": json.dumps(arguments, sort_keys=True)}],
            "structuredContent": {"server": real, "tool": tool, "arguments": arguments},
            "isError": False,
        }

    def _m_save_tool(self, request_id: int, name: str, source: str, description: str) -> Any:
        replaced = name in self.skills
        self.skills[name] = {"name": name, "source": source, "description": description, "saved_at": "now"}
        return {"name": name, "replaced": replaced}

    def _m_list_skills(self, request_id: int) -> Any:
        return {
            "skills": [{k: s[k] for k in ("name", "description", "saved_at")} for s in self.skills.values()]
        }

    def _m_load_skill(self, request_id: int, name: str) -> Any:
        if name not in self.skills:
            raise RpcFault("unknown_tool", f"No saved tool named {name!r}")
        return {k: self.skills[name][k] for k in ("name", "source", "description")}


_LATER = object()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "structuredContent": None, "isError": False}


# -- the kernel ------------------------------------------------------------------------------------------
@dataclass
class CellResult:
    status: str = ""
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    error: dict[str, Any] | None = None
    """The iopub ``error`` message (else, for an error, the execute reply)."""
    reply: dict[str, Any] = field(default_factory=dict)
    """The execute reply's content."""

    @property
    def value(self) -> Any:
        """The cell's last expression, which tests make a ``json.dumps(...)`` string."""
        assert self.status == "ok", self.describe()
        assert self.result is not None, self.describe()
        return json.loads(ast.literal_eval(self.result))

    @property
    def traceback(self) -> str:
        """The error's traceback without terminal colours."""
        return _ANSI.sub("", "\n".join((self.error or {}).get("traceback", [])))

    def describe(self) -> str:
        tb = self.traceback
        return f"status={self.status} stdout={self.stdout!r} stderr={self.stderr!r}\n{tb}"


class SandboxKernel:
    """A running kernel and a client connected to it."""

    def __init__(
        self, proc: subprocess.Popen[bytes], client: BlockingKernelClient, host: FakeHost | None
    ) -> None:
        self.proc = proc
        self.client = client
        self.host = host

    def start(self, code: str, silent: bool = False) -> str:
        return self.client.execute(code, silent=silent, store_history=not silent, allow_stdin=False)

    def collect(self, msg_id: str, timeout: float = CELL_TIMEOUT) -> CellResult:
        """Outputs of one execute request until its iopub idle and shell reply, bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        cell = CellResult()

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"cell {msg_id} did not finish within {timeout} s: {cell.describe()}")
            return left

        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=remaining())
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    cell.stdout += content["text"]
                else:
                    cell.stderr += content["text"]
            elif kind == "execute_result":
                cell.result = content["data"].get("text/plain")
            elif kind == "error":
                cell.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        while True:
            try:
                reply = self.client.get_shell_msg(timeout=remaining())
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                cell.reply = reply["content"]
                cell.status = reply["content"]["status"]
                if cell.status == "error" and cell.error is None:
                    cell.error = reply["content"]
                return cell

    def run(self, code: str, timeout: float = CELL_TIMEOUT, silent: bool = False) -> CellResult:
        return self.collect(self.start(code, silent=silent), timeout)

    def ok(self, code: str, timeout: float = CELL_TIMEOUT) -> CellResult:
        cell = self.run(code, timeout)
        assert cell.status == "ok", cell.describe()
        return cell

    def value(self, code: str, timeout: float = CELL_TIMEOUT) -> Any:
        """Run ``code``, whose last statement is an expression; return that value through JSON."""
        code = textwrap.dedent(code).strip()
        last = ast.parse(code).body[-1]
        assert isinstance(last, ast.Expr), "the cell must end with an expression"
        lines = code.splitlines()
        expression = ast.get_source_segment(code, last)
        head = "\n".join(lines[: last.lineno - 1])
        return self.ok(f"{head}\nimport json as _j\n_j.dumps(({expression}))", timeout).value

    def refresh(self) -> CellResult:
        """What the session layer sends after a grant change: a silent execute request."""
        return self.run(REFRESH_CODE, silent=True)

    def interrupt(self) -> None:
        """What the agent does for an ``interrupt`` frame: SIGINT to the kernel process."""
        os.kill(self.proc.pid, signal.SIGINT)


@contextlib.contextmanager
def sandbox_kernel(workdir: Path, with_host: bool = True) -> Iterator[SandboxKernel]:
    """Start a kernel (with a FakeHost on its rpc socket unless ``with_host`` is false); stop it after."""
    workdir.mkdir(parents=True, exist_ok=True)
    connection_file = workdir / "kernel.json"
    write_connection_file(str(connection_file), ip="127.0.0.1", key=secrets.token_hex(16).encode())
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join([str(PYTHONPATH_DIR), str(REPO)]),
        "IPYTHONDIR": str(workdir / "ipython"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    # The agent's own argv (kernel class, out stream, extensions); -Xfrozen_modules=off (with
    # PYDEVD_DISABLE_FILE_VALIDATION) keeps debugpy, should a cell import it (the kernel itself
    # loads none), from warning about frozen modules.
    argv = kernel_argv(str(connection_file), python=(sys.executable, "-Xfrozen_modules=off"))
    host_end: socket.socket | None = None
    pass_fds: tuple[int, ...] = ()
    kernel_end: socket.socket | None = None
    if with_host:
        host_end, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env["KERNELBRIDGE_RPC_FD"] = str(kernel_end.fileno())
        pass_fds = (kernel_end.fileno(),)
    with open(workdir / "kernel.log", "wb") as log:
        proc = subprocess.Popen(
            argv,
            env=env,
            pass_fds=pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a ^C in the test's terminal is not the kernel's interrupt
        )
    if kernel_end is not None:
        kernel_end.close()  # the kernel holds its own copy
    host = FakeHost(host_end) if host_end is not None else None
    client = BlockingKernelClient()
    try:
        client.load_connection_file(str(connection_file))
        # No heartbeat channel: before the kernel's first beat, jupyter_client takes a silent heartbeat
        # for a dead kernel and gives up; the bounded wait for kernel_info is enough here.
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=KERNEL_READY_TIMEOUT)
        yield SandboxKernel(proc, client, host)
    finally:
        with contextlib.suppress(Exception):
            client.shutdown()
        try:
            proc.wait(SHUTDOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            # ipykernel 7.4 now and then never exits after answering shutdown_request (seen with no
            # extension loaded at all, about 1 start in 20 here): end the kernel's process group.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(SHUTDOWN_TIMEOUT)
        client.stop_channels()
        if host is not None:
            host.close()
