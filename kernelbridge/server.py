"""The MCP face of kernelbridge: four tools, two resources, and the process lifecycle.

This module turns tool calls into :class:`~kernelbridge.sessions.SessionRegistry` operations and
renders results for a model: short text first (what a model reads), images as image content, and
the full record as ``structuredContent``. Failures a model can act on (a bad argument, too many
sessions, a sandbox that will not start) are ``ToolError``s with one-line messages; a user's
Python error is a normal result with ``isError`` set.

The registry lives in the server lifespan (no global state): it is created when the transport
starts and torn down, shielded and bounded, when the client disconnects or a signal arrives.
Tool descriptions are deliberately terse: every byte of ``tools/list`` costs context in every
conversation. The manual lives in the capabilities resource instead.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.stdio import stdio_server
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent

from kernelbridge import __version__
from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.execution import CellResult
from kernelbridge.notebook import load_session_notebook, notebook_json
from kernelbridge.runtime import RuntimeBackend, open_runtime, reap_orphans
from kernelbridge.sessions import SessionRegistry, validate_session_name

log = logging.getLogger(__name__)

MAX_CODE_CHARS = 1_000_000
"""Longer code is almost certainly data pasted by mistake; it would also bloat the journal."""
MAX_IMAGES = 10
"""Images returned per call; more would flood the model's context."""

CAPABILITIES = """\
# kernelbridge sandbox

`run_python` runs code in a persistent IPython kernel inside a locked-down container.

- State persists per `session` (default "default"): variables, imports, functions and files
  in /workspace (writable, 256 MB) and /tmp. Sessions are isolated from each other.
- Top-level `await` works. The last expression's value is returned, like a notebook cell.
- No network. Calling host MCP servers (`servers=[...]`) is not available yet.
- Limits: memory (512 MB by default), CPU, processes. `input()` is not available.
- `timeout` (seconds) interrupts the cell; if it does not stop, the kernel restarts and the
  result says `state: lost`. Output is truncated (head and tail kept) past a limit.
- `IPython.display.display(Image(...))` / matplotlib figures come back as images.
- Tools: list_sessions, close_session (frees the sandbox), export_notebook (.ipynb of a session).
- Each session is also a notebook resource: kernelbridge://sessions/{session}/notebook
"""


@dataclass(slots=True)
class BridgeContext:
    """What the lifespan provides to every request."""

    settings: Settings
    registry: SessionRegistry


def render_text(result: CellResult) -> str:
    """The text a model reads: outputs verbatim, then one status line."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    if result.stderr:
        err = result.stderr if result.stderr.endswith("\n") else result.stderr + "\n"
        parts.append("[stderr]\n" + err)
    if result.error is not None:
        parts.append(result.error.traceback + "\n")
    if result.result is not None:
        parts.append(f"Out[{result.execution_count}]: {result.result}\n")
    parts.extend(note + "\n" for note in result.notes)
    where = f"[{result.execution_count}]" if result.execution_count is not None else ""
    line = f"-- {result.status}{' ' + where if where else ''} in session {result.session!r}, "
    line += f"{result.duration_ms} ms, state {result.state}"
    if result.truncated:
        line += ", output truncated"
    return "".join(parts) + line


def to_tool_result(result: CellResult) -> CallToolResult:
    content: list[ContentBlock] = [TextContent(type="text", text=render_text(result))]
    for png in result.images[:MAX_IMAGES]:
        content.append(ImageContent(type="image", data=png, mime_type="image/png"))
    return CallToolResult(
        content=content, structured_content=result.structured(), is_error=result.status != "ok"
    )


def _registry(ctx: Context) -> SessionRegistry:
    bridge: BridgeContext = ctx.request_context.lifespan_context
    return bridge.registry


def _check_session(session: str) -> str:
    try:
        return validate_session_name(session)
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None


def build_server(settings: Settings, *, runtime: RuntimeBackend | None = None) -> MCPServer[BridgeContext]:
    """The kernelbridge MCP server. ``runtime`` is a test seam (default: the configured engine)."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[BridgeContext]) -> AsyncIterator[BridgeContext]:
        async with AsyncExitStack() as stack:
            backend = runtime
            if backend is None:
                backend = await stack.enter_async_context(open_runtime(settings))
                await _reap_orphans(backend)
            image, agent_hash = _sandbox_image(settings, testing=runtime is not None)
            registry = SessionRegistry(settings, backend, image=image, agent_hash=agent_hash)
            await stack.enter_async_context(registry)
            yield BridgeContext(settings, registry)

    async def run_python(
        code: str,
        ctx: Context,
        session: str = "default",
        servers: list[str] = [],  # noqa: B006 - the public signature; never mutated
        timeout: int = 30,
    ) -> CallToolResult:
        if not code.strip():
            raise ToolError("code is empty: pass the Python source to run")
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"code is {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}")
        _check_session(session)
        if not 1 <= timeout <= settings.max_timeout:
            raise ToolError(f"timeout must be between 1 and {settings.max_timeout:g} seconds, got {timeout}")

        async def progress(elapsed: float, tail: str) -> None:
            await ctx.report_progress(round(elapsed, 1), float(timeout), tail or "running")

        registry = _registry(ctx)
        try:
            result = await registry.run(session, code, timeout=timeout, servers=servers, on_progress=progress)
        except KernelBridgeError as exc:
            raise ToolError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
        return to_tool_result(result)

    async def list_sessions(ctx: Context) -> str:
        registry = _registry(ctx)
        return json.dumps({"sessions": registry.describe(), "warm": registry.warm_kernels})

    async def close_session(session: str, ctx: Context) -> str:
        closed = await _registry(ctx).close(_check_session(session))
        return f"closed session {session!r}" if closed else f"no open session {session!r}"

    async def export_notebook(session: str, ctx: Context, path: str | None = None) -> str:
        nb_text = notebook_json(_load_notebook(settings, _check_session(session)))
        if path is None:
            return nb_text
        target = _export_target(settings, path)
        await anyio.Path(target).write_text(nb_text, encoding="utf-8")
        return f"wrote {path}"  # as the model gave it: the resolved host path is not its business

    tools = [
        _compact_tool(run_python, RUN_PYTHON_DOC, structured_output=False),
        _compact_tool(list_sessions, "List open sessions."),
        _compact_tool(close_session, "Close a session; removes its sandbox."),
        _compact_tool(export_notebook, "Session history as .ipynb (JSON, or written to path)."),
    ]
    app: MCPServer[BridgeContext] = MCPServer(
        "kernelbridge", version=__version__, lifespan=lifespan, tools=tools, log_level="WARNING"
    )

    @app.resource("kernelbridge://capabilities", name="capabilities", mime_type="text/markdown")
    def capabilities() -> str:
        return CAPABILITIES

    @app.resource(
        "kernelbridge://sessions/{session}/notebook",
        name="session-notebook",
        description="A session's history as an .ipynb notebook",
        mime_type="application/x-ipynb+json",
    )
    def session_notebook(session: str) -> str:
        return notebook_json(_load_notebook(settings, _check_session(session)))

    return app


RUN_PYTHON_DOC = (
    "Run Python in a persistent sandboxed IPython session (state kept per session). "
    "Manual: kernelbridge://capabilities"
)


def _compact_schema(schema: Any) -> Any:
    """Drop what a model does not need from a pydantic JSON schema: titles, and the ``null``
    branch of optional arguments (omitting an argument means the same)."""
    if isinstance(schema, list):
        return [_compact_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _compact_schema(v) for k, v in schema.items() if k != "title"}
    branches = out.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches and len(branches) == 2:
        del out["anyOf"]
        out.update(next(b for b in branches if b != {"type": "null"}))
        if out.get("default", 0) is None:
            del out["default"]
    return out


def _compact_tool(fn: Any, description: str, structured_output: bool = False) -> Tool:
    """A tool whose published schema is as small as possible: every byte of tools/list is
    context spent in every conversation. Arguments are still validated by the full model."""
    tool = Tool.from_function(fn, description=description, structured_output=structured_output)
    tool.parameters = _compact_schema(tool.parameters)
    return tool


def _load_notebook(settings: Settings, session: str) -> Any:
    try:
        return load_session_notebook(settings.sessions_dir, session)
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None


def _export_target(settings: Settings, path: str) -> Path:
    """Where export_notebook may write: only ``.ipynb`` files, relative paths under the state dir.

    The path comes from the model, so it must not become a way to write arbitrary host files.
    """
    target = Path(path).expanduser()
    if target.suffix != ".ipynb":
        raise ToolError(f"path must end in .ipynb, got {path!r}")
    if not target.is_absolute():
        target = settings.state_dir / "exports" / target
    target = target.resolve()
    if not target.parent.is_dir():
        if target.parent.is_relative_to(settings.state_dir.resolve()):
            target.parent.mkdir(parents=True, exist_ok=True)
        else:
            raise ToolError(f"directory {str(target.parent)!r} does not exist")
    return target


def _sandbox_image(settings: Settings, *, testing: bool) -> tuple[str, str | None]:
    from kernelbridge.kernel.launch import expected_image

    if testing and not settings.image:
        return "test-double", None  # an injected runtime (the local test double) has no images
    return expected_image(settings)


async def _reap_orphans(runtime: RuntimeBackend) -> None:
    """Remove containers left by bridges that were SIGKILLed (best effort: never blocks serving)."""
    try:
        with anyio.fail_after(30):
            removed = await reap_orphans(runtime)
        if removed:
            log.warning("removed %d sandbox container(s) left by a dead kernelbridge", removed)
    except Exception:
        log.warning("reaping orphaned sandboxes failed", exc_info=True)


class _PipeLines:
    """Lines from a pipe, read without a worker thread.

    The SDK reads stdin with ``anyio.wrap_file``, i.e. in a worker thread that no cancellation
    can interrupt: a SIGTERM arriving while the client is silent would wait for a line that never
    comes, and the sandboxes would never be removed. Waiting for readability on the event loop
    instead makes the read cancellable. Only for pipes and sockets (epoll refuses regular files).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = bytearray()
        self._scanned = 0

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        while (end := self._buf.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._buf)
            await anyio.wait_readable(self._fd)
            chunk = os.read(self._fd, READ_CHUNK)
            if not chunk:
                if not self._buf:
                    raise StopAsyncIteration
                end = len(self._buf)
                break
            self._buf += chunk
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        self._scanned = 0
        return line.decode("utf-8", errors="replace")


READ_CHUNK = 1 << 16


@contextmanager
def _claim_stdin() -> Iterator[int | None]:
    """Move the MCP wire off fd 0 (to a private fd) and put /dev/null there, so that child
    processes (podman, tunnels) can never read the client's messages. Yields None when stdin is
    not a pipe or socket; the SDK's own reader is used then."""
    mode = os.fstat(0).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        yield None
        return
    private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        yield private
    finally:
        os.dup2(private, 0)
        os.close(private)


async def _serve_stdio(app: MCPServer[BridgeContext]) -> None:
    """Serve until stdin closes or SIGTERM/SIGINT/SIGHUP; the lifespan then stops every sandbox."""
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    log.warning("received %s; closing every session", signal.Signals(signum).name)
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(on_signal)
        with _claim_stdin() as fd:
            if fd is None:
                await app.run_stdio_async()
            else:
                # What MCPServer.run_stdio_async does, with a cancellable stdin. The low-level
                # server is reached through a private attribute: MCPServer has no public way to
                # run on given streams.
                lowlevel = app._lowlevel_server
                async with stdio_server(stdin=_PipeLines(fd)) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
        tg.cancel_scope.cancel()


def serve(settings: Settings, *, http: bool = False, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the MCP server until the client disconnects or a signal arrives.

    ``http=True`` serves streamable HTTP on ``host:port`` (uvicorn handles the signals there);
    all HTTP clients share one session registry.
    """
    app = build_server(settings)
    if http:
        anyio.run(lambda: app.run_streamable_http_async(host=host, port=port))
    else:
        anyio.run(_serve_stdio, app)
