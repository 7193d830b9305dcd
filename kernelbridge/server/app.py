"""The kernelbridge MCP server: its tools, resources and lifespan.

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

import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from kernelbridge import __version__
from kernelbridge.broker import Dispatch
from kernelbridge.config import Settings, check_state_dir
from kernelbridge.errors import KernelBridgeError, RuntimeUnavailable
from kernelbridge.hub import Hub, RpcCall
from kernelbridge.notebook import notebook_json
from kernelbridge.runtime import RuntimeBackend, open_runtime, reap_orphans
from kernelbridge.runtime.unavailable import UnavailableRuntime
from kernelbridge.server.exports import export_to_file, load_notebook
from kernelbridge.server.files import decode_files, place_files, register_file_resources
from kernelbridge.server.images import fit_images, register_output_resources
from kernelbridge.server.manual import ServerLine, render_manual
from kernelbridge.server.render import to_tool_result
from kernelbridge.server.restore import report_result, report_text, restore_session
from kernelbridge.server.schema import compact_tool
from kernelbridge.server.stdio import serve_stdio
from kernelbridge.sessions import SessionRegistry, validate_session_name

log = logging.getLogger(__name__)

MAX_CODE_CHARS = 1_000_000
"""Longer code is almost certainly data pasted by mistake; it would also bloat the journal."""


@dataclass(slots=True)
class BridgeContext:
    """What the lifespan provides to every request."""

    settings: Settings
    registry: SessionRegistry
    hub: Hub


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

    # The running lifespan's hub, for the capabilities resource: static resources get no Context.
    hubs: list[Hub] = []

    @asynccontextmanager
    async def lifespan(_: MCPServer[BridgeContext]) -> AsyncIterator[BridgeContext]:
        async with AsyncExitStack() as stack:
            backend = runtime
            if backend is None:
                try:
                    backend = await stack.enter_async_context(open_runtime(settings))
                except RuntimeUnavailable as exc:
                    # Keep serving: tools/list and the manual still answer, and each call says
                    # exactly what is missing instead of the client seeing the server die.
                    log.warning("%s; serving without sandboxes", exc)
                    backend = UnavailableRuntime(str(exc))
                else:
                    await _reap_orphans(backend)
            image, agent_hash = _sandbox_image(settings, testing=runtime is not None)
            hub = await stack.enter_async_context(Hub(settings))
            hubs.append(hub)
            stack.callback(hubs.remove, hub)
            registry = SessionRegistry(
                settings,
                backend,
                image=image,
                agent_hash=agent_hash,
                dispatch=hub_dispatch(hub),
                check_grants=hub.validate_grants,
            )
            await stack.enter_async_context(registry)
            yield BridgeContext(settings, registry, hub)

    async def run_python(
        code: str,
        ctx: Context,
        session: str = "default",
        servers: list[str] = [],  # noqa: B006 - the public signature; never mutated
        timeout: int = 30,
        files: dict[str, str] | None = None,
        restore: str | None = None,
    ) -> CallToolResult:
        if not code.strip() and not files and not restore:
            raise ToolError("code is empty: pass the Python source to run")
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"code is {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}")
        _check_session(session)
        if not 1 <= timeout <= settings.max_timeout:
            raise ToolError(f"timeout must be between 1 and {settings.max_timeout:g} seconds, got {timeout}")

        async def progress(elapsed: float, tail: str) -> None:
            await ctx.report_progress(round(elapsed, 1), float(timeout), tail or "running")

        registry = _registry(ctx)
        placed = decode_files(files or {})
        try:
            # In order: rebuild from a notebook, place files, run the code; each step optional.
            restored = await restore_session(settings, registry, session, restore) if restore else None
            notes = [await place_files(await registry.sandbox(session), placed)] if placed else []
            if not code.strip():
                if restored is not None:
                    return report_result(session, restored, notes)
                return CallToolResult(content=[TextContent(type="text", text=notes[0])])
            result = await registry.run(session, code, timeout=timeout, servers=servers, on_progress=progress)
        except KernelBridgeError as exc:
            raise ToolError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
        if restored is not None:
            notes.insert(0, report_text(session, restored))
        result.notes[:0] = notes
        fitted = await fit_images(result.images, session, settings.image_budget)
        result.notes.extend(fitted.notes)
        return to_tool_result(result, media=fitted.blocks)

    async def list_sessions(ctx: Context) -> str:
        registry = _registry(ctx)
        return json.dumps({"sessions": registry.describe(), "warm": registry.warm_kernels})

    async def close_session(session: str, ctx: Context) -> str:
        closed = await _registry(ctx).close(_check_session(session))
        return f"closed session {session!r}" if closed else f"no open session {session!r}"

    async def export_notebook(session: str, ctx: Context, path: str | None = None) -> str:
        nb_text = notebook_json(load_notebook(settings, _check_session(session)))
        if path is None:
            return nb_text
        await export_to_file(settings, path, nb_text)
        return f"wrote {path}"  # as the model gave it: the resolved host path is not its business

    tools = [
        compact_tool(run_python, RUN_PYTHON_DOC, structured_output=False),
        compact_tool(list_sessions, "List open sessions."),
        compact_tool(close_session, "Close a session; removes its sandbox."),
        compact_tool(export_notebook, "Session history as .ipynb (JSON, or written to path)."),
    ]
    app: MCPServer[BridgeContext] = MCPServer(
        "kernelbridge", version=__version__, lifespan=lifespan, tools=tools, log_level="WARNING"
    )

    @app.resource("kernelbridge://capabilities", name="capabilities", mime_type="text/markdown")
    def capabilities() -> str:
        if not hubs:
            return render_manual()
        hub = hubs[-1]
        servers = [ServerLine(s["name"], s["alias"], s["description"]) for s in hub.summaries()]
        return render_manual(servers, hub.problems())

    @app.resource(
        "kernelbridge://sessions/{session}/notebook",
        name="session-notebook",
        description="A session's history as an .ipynb notebook",
        mime_type="application/x-ipynb+json",
    )
    def session_notebook(session: str) -> str:
        return notebook_json(load_notebook(settings, _check_session(session)))

    register_file_resources(app, _registry)
    register_output_resources(app, settings.sessions_dir)

    return app


RUN_PYTHON_DOC = (
    "Run Python in a persistent sandboxed IPython session (state kept per session). "
    "Manual: kernelbridge://capabilities"
)


def hub_dispatch(hub: Hub) -> Dispatch:
    """The session layer's rpc dispatch, answered by ``hub``."""

    async def dispatch(session: str, grants: frozenset[str], method: str, params: Any) -> Any:
        return await hub.dispatch(RpcCall(session, grants, method, params))

    return dispatch


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


def serve(settings: Settings, *, http: bool = False, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the MCP server until the client disconnects or a signal arrives.

    ``http=True`` serves streamable HTTP on ``host:port`` (uvicorn handles the signals there);
    all HTTP clients share one session registry.
    """
    check_state_dir(settings)  # one line and exit 1, not a traceback from inside the lifespan
    app = build_server(settings)
    if http:
        anyio.run(lambda: app.run_streamable_http_async(host=host, port=port))
    else:
        anyio.run(serve_stdio, app)
