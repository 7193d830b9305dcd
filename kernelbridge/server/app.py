"""The kernelbridge MCP server: its tools, resources and lifespan.

This module turns tool calls into :class:`~kernelbridge.session.registry.SessionRegistry`
operations and has their results rendered for a model (:mod:`kernelbridge.server.render`: short
text first, images as image content, the full record as ``structuredContent``). Failures a model
can act on (a bad argument, too many sessions, a sandbox that will not start) are ``ToolError``s
with one-line messages; a user's Python error is a normal result with ``isError`` set.

The registry lives in the server lifespan (no global state): it is created when the transport
starts and torn down, shielded and bounded, when the client disconnects or a signal arrives.
Tool descriptions are deliberately terse: every byte of ``tools/list`` costs context in every
conversation. The manual lives in the capabilities resource instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, InputRequiredResult

from kernelbridge import __version__
from kernelbridge.config import Settings, check_state_dir, misconfigured, with_problem
from kernelbridge.errors import ConfigError, KernelBridgeError, RuntimeUnavailable
from kernelbridge.server.approval import (
    KEEP_FINISHED,
    CallRun,
    RunTable,
    drive,
    elicitation_mode,
    take_answers,
)
from kernelbridge.server.departure import Departure
from kernelbridge.server.exports import (
    ExportLimiters,
    export_root,
    export_to_file,
    notebook_for_resource,
    notebook_summary,
    notebook_uri,
)
from kernelbridge.server.files import decode_files, place_files, register_file_resources
from kernelbridge.server.http import HttpOptions, namespace_of, namespace_of_request, serve_http
from kernelbridge.server.images import fit_images, register_output_resources
from kernelbridge.server.manual import ServerLine, packages_section, render_manual
from kernelbridge.server.namespaces import Namespaces
from kernelbridge.server.notes import LimitsNotEnforced, Restored
from kernelbridge.server.render import export_result, notes_result, restore_result, to_tool_result
from kernelbridge.server.restore import SessionCalls, restore_session
from kernelbridge.server.schema import compact_tool
from kernelbridge.server.start import start_gate, starting
from kernelbridge.server.stdio import serve_stdio
from kernelbridge.server.tasks import (
    Bridge,
    TaskExtension,
    TaskRecord,
    TaskStore,
    TaskTable,
    current_task,
    run_task,
)
from kernelbridge.session.generations import parse_ref
from kernelbridge.session.outcome import Note
from kernelbridge.session.store import adoptable_containers, validate_session_name

if TYPE_CHECKING:  # imported by the start, after the bridge answered initialize (server/start.py)
    from kernelbridge.host.policy import SandboxGate, SandboxPolicy
    from kernelbridge.hub.dispatch import Hub
    from kernelbridge.packages.service import PackageService
    from kernelbridge.runtime.base import RuntimeBackend
    from kernelbridge.session.cell import CellResult
    from kernelbridge.session.registry import SessionRegistry

log = logging.getLogger(__name__)

MAX_CODE_CHARS = 1_000_000
"""Longer code is almost certainly data pasted by mistake; it would also bloat the journal."""
ADOPTION_WAIT = 5.0
"""Longest a start waits for the adoption of the sessions the bridge before left (~0.1 s for one
here, 4.6 s for 50) before it answers initialize (clients allow tens of seconds for that)."""


@dataclass(slots=True)
class BridgeContext:
    """What the lifespan provides to every request."""

    settings: Settings
    namespaces: Namespaces
    hub: Hub
    gate: SandboxGate | None = None
    """What sandboxes this bridge may start (None: an injected test runtime, anything goes)."""
    packages: PackageService | None = None
    """``%pip install`` through the host, for every namespace (None: a test runtime without one)."""
    exports: ExportLimiters = dataclasses.field(default_factory=ExportLimiters)
    """One journal reader (export, notebook and outputs resources) at a time per namespace."""
    runs: RunTable = dataclasses.field(default_factory=RunTable)
    """The cells of ``run_python`` calls, run as the bridge's tasks (see :mod:`.approval`)."""
    calls: SessionCalls | None = None
    """The registries' rpc handler in front of the hub: an automatic restore's answers."""
    tasks: TaskTable | None = None
    """``run_python`` calls run as MCP tasks, per namespace (see :mod:`.tasks`)."""

    @property
    def registry(self) -> SessionRegistry:
        """The shared namespace's registry (stdio); HTTP clients with tokens use their own."""
        return self.namespaces.registry("")


def _bridge(ctx: Context) -> BridgeContext:
    return cast(BridgeContext, ctx.request_context.lifespan_context)


def _registry(ctx: Context) -> SessionRegistry:
    """The registry of the calling client's namespace (see kernelbridge.server.namespaces)."""
    return _bridge(ctx).namespaces.registry(namespace_of(ctx))


def _settings(ctx: Context) -> Settings:
    """The settings of the calling client's namespace (its own state directory)."""
    return _bridge(ctx).namespaces.settings(namespace_of(ctx))


def _reader(ctx: Context) -> anyio.CapacityLimiter:
    """The calling client's namespace's journal reader (exports are read one at a time each)."""
    return _bridge(ctx).exports.of(namespace_of(ctx))


MAX_NAME_ECHO = 100
"""Characters of a refused session name said back (a megabyte of name must not come back whole)."""


def _check_session(session: str) -> str:
    try:
        return validate_session_name(_bounded(session))
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None


def _check_ref(session: str) -> str:
    """A session to read the record of: a name (its current generation) or ``name@N``."""
    try:
        parse_ref(_bounded(session))
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None
    return session


def _bounded(session: str) -> str:
    """``session``, or a cut of it that is still invalid when it is too long to be a name."""
    return session if len(session) <= MAX_NAME_ECHO else session[:MAX_NAME_ECHO] + "/..."


def build_server(
    settings: Settings,
    *,
    runtime: RuntimeBackend | None = None,
    namespaces: list[str] | None = None,
    departure: Departure | None = None,
) -> MCPServer[BridgeContext]:
    """The kernelbridge MCP server. ``runtime`` is a test seam (default: the configured engine);
    ``departure`` is announced by the transport when the bridge is about to go.

    ``namespaces``: the HTTP tokens' namespaces, each with sessions of its own; None serves one
    shared namespace (stdio, or HTTP without authentication).
    """

    # The running lifespan's hub, for the capabilities resource: static resources get no Context.
    hubs: list[Hub] = []
    facts = HostFacts()

    @asynccontextmanager
    async def open_bridge() -> AsyncIterator[BridgeContext]:
        """What the bridge opens as it starts (run by ``server.start.starting``)."""
        from kernelbridge.host.policy import SandboxGate, SandboxPolicy
        from kernelbridge.hub.dispatch import Hub
        from kernelbridge.packages.service import PackageService, WithPackages
        from kernelbridge.runtime.select import open_runtime
        from kernelbridge.runtime.unavailable import UnavailableRuntime
        from kernelbridge.session.registry import SessionRegistry

        async with AsyncExitStack() as stack:
            backend = runtime
            gate = None
            served = settings
            if settings.problems:
                # A setting that cannot be read: serve all the same (a client shows only "connection
                # closed" for a bridge that dies), starting no sandbox and touching nothing of the
                # state directory (which may be what is wrong): each call says what to fix.
                refusal = misconfigured(settings.problems)
                log.warning("%s", refusal)
                scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="kernelbridge-"))
                served = dataclasses.replace(settings, state_dir=Path(scratch))
                backend = UnavailableRuntime(refusal)
                policy = SandboxPolicy(settings.image or "?", None, refusal=refusal)
                gate = SandboxGate(served, backend, policy)
            elif backend is None:
                try:
                    backend = await stack.enter_async_context(open_runtime(settings))
                except RuntimeUnavailable as exc:
                    # Keep serving: tools/list and the manual still answer, and each call says
                    # exactly what is missing instead of the client seeing the server die.
                    log.warning("%s; serving without sandboxes", exc)
                    backend = UnavailableRuntime(str(exc))
                else:
                    await _reap_orphans(backend, settings)
                # Limits enforced (or allowed not to be), a kernelbridge image: decided now, and
                # again at each call while it can still change (a daemon started, an image built).
                gate = await SandboxGate.open(settings, backend)
                policy = gate.policy
            else:
                image, agent_hash = _sandbox_image(settings, testing=True)
                policy = SandboxPolicy(image, agent_hash)
            facts.policy = policy
            reattach = await _can_reattach(backend)
            hub = await stack.enter_async_context(Hub(served))
            hubs.append(hub)
            stack.callback(hubs.remove, hub)
            # %pip install through the host: one service (and wheel cache) for every namespace.
            packages = PackageService(served)
            calls = SessionCalls(hub)
            rpc = WithPackages(packages, calls)

            def make_registry(registry_settings: Settings) -> SessionRegistry:
                if policy.refusal:  # a warm pool would only fail (or run unlimited sandboxes)
                    registry_settings = dataclasses.replace(registry_settings, warm_pool=0)
                if not reattach:  # the CLI backend: sessions end with their bridge, as `doctor` says
                    registry_settings = dataclasses.replace(registry_settings, durable=False)
                return SessionRegistry(
                    registry_settings,
                    backend,
                    image=policy.image,
                    agent_hash=policy.agent_hash,
                    dispatch=rpc,
                    check_grants=hub.validate_grants,
                )

            spaces = Namespaces(
                served,
                namespaces if namespaces is not None else [""],
                make_registry,
                max_calls=settings.http.max_calls if namespaces is not None else None,
            )
            await stack.enter_async_context(spaces)
            if departure is not None:
                stack.callback(departure.subscribe(spaces.leave))
            # A restarted client's first call comes right after initialize: adopting the sessions
            # the bridge before left first (bounded; the rest go on in the background, a first
            # call waiting for its own) makes that call as quick as any other.
            await spaces.settle(ADOPTION_WAIT)
            runs = await stack.enter_async_context(RunTable())  # closed first: cells before sessions

            def resume(record: TaskRecord, store: TaskStore, left: str) -> None:
                """Follow a task the bridge before left running: its cell, inherited with its
                session, ends here, and its result is the task's."""
                registry = spaces.registry(record.namespace)
                timeout = record.timeout or settings.max_task_time

                async def follow() -> dict[str, Any] | None:
                    remaining = max(1.0, record.created + timeout - time.time())
                    result = await registry.follow(
                        record.session,
                        record.cell,
                        timeout=remaining,
                        label=record.label,
                        since=record.started,
                    )
                    if result is None:
                        return None
                    answer = await _rendered(result, settings)
                    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)

                runs.spawn(lambda: run_task(record, store, follow, left))

            tasks = TaskTable(lambda namespace: spaces.settings(namespace).state_dir, resume)
            for namespace in spaces.names:  # its calls queue behind it, as they did before
                tasks.take_over(namespace)
            yield BridgeContext(
                served, spaces, hub, gate, runs=runs, packages=packages, calls=calls, tasks=tasks
            )

    async def run_python(
        code: str,
        ctx: Context,
        session: str = "default",
        servers: list[str] = [],  # noqa: B006 - the public signature; never mutated
        # The configured default (KERNELBRIDGE_DEFAULT_TIMEOUT), so that the schema says it too.
        timeout: int = math.ceil(settings.default_timeout),
        files: dict[str, str] | None = None,
        restore: str | None = None,
    ) -> CallToolResult | InputRequiredResult:
        bridge, namespace = _bridge(ctx), namespace_of(ctx)
        task = current_task()  # this call runs as an MCP task (a long job): see server/tasks.py
        longest = settings.max_task_time if task is not None else settings.max_timeout

        async def progress(elapsed: float, tail: str) -> None:
            await ctx.report_progress(round(elapsed, 1), float(timeout), tail or "running")

        if ctx.request_state is not None:  # a 2026-07-28 client's retry with its user's answers
            run = bridge.runs.find(ctx.request_state, namespace)
            if run is None:
                raise ToolError(
                    "this call's approval question is no longer pending (its cell ended over"
                    f" {KEEP_FINISHED:g} s ago, or the bridge restarted); run the code again if needed"
                )
            take_answers(run, ctx.input_responses)
            run.progress = progress
            return await _collect(run, ctx, bridge)
        if not code.strip() and not files and not restore:
            raise ToolError("code is empty: pass the Python source to run")
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"code is {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}")
        _check_session(session)
        if not 1 <= timeout <= longest:
            got = f", got {timeout}" if abs(timeout) < 10**9 else ""
            kind = " for a task (KERNELBRIDGE_MAX_TASK_TIME)" if task is not None else ""
            raise ToolError(f"timeout must be between 1 and {longest:g} seconds{kind}{got}")

        placed = decode_files(files or {})
        try:
            with bridge.namespaces.call(namespace):  # per-token calls in flight (HTTP)
                policy = await bridge.gate.check() if bridge.gate is not None else facts.policy
                facts.policy = policy
                registry, own = bridge.namespaces.registry(namespace), bridge.namespaces.settings(namespace)
                bridge.namespaces.check_new_session(namespace, session)
                # In order: rebuild from a notebook, place files, run the code; each step optional.
                restored, auto, lost = None, None, None
                if not restore and (lost := await registry.adopt_or_lost(session)) is not None:
                    if not (own.auto_restore and lost.restore and bridge.calls is not None):
                        from kernelbridge.session.durability import lost_result

                        return to_tool_result(lost_result(session, lost))  # nothing ran: the model chooses
                    restore, auto = lost.restore, bridge.calls  # rebuilt from its recording first
                if restore:
                    reader = bridge.exports.of(namespace)
                    restored = await restore_session(
                        own,
                        registry,
                        session,
                        restore,
                        budget=timeout,
                        reader=reader,
                        packages=bridge.packages,
                        recorded=auto,
                    )
                notes: list[Note] = []
                if auto is not None and lost is not None:
                    notes.append(dataclasses.replace(lost, rebuilt=True))
                if placed:
                    notes.append(await place_files(await registry.sandbox(session), placed))
                if not code.strip():
                    if restored is not None:
                        return restore_result(session, restored, notes)
                    return notes_result(notes)
                # A task's request has been answered: nobody is there to ask (its approvals refused).
                run = CallRun(namespace, elicitation_mode(ctx) if task is None else None)
                run.progress = progress

                async def cell() -> CallToolResult:
                    result = await registry.run(
                        session, code, timeout=timeout, servers=servers, on_progress=run.report,
                        approve=run.approve, label=task.label if task is not None else None,
                        queue_wait=None if task is not None else timeout,
                        msg_id=task.cell if task is not None else None,
                    )  # fmt: skip
                    if policy is not None and policy.unlimited and result.execution_count == 1:
                        notes.append(LimitsNotEnforced())
                    if restored is not None:
                        notes.insert(1 if auto is not None else 0, Restored(session, restored))
                    result.notes[:0] = notes
                    return await _rendered(result, settings)

                bridge.runs.start(run, cell)
                return await _collect(run, ctx, bridge)
        except KernelBridgeError as exc:
            raise ToolError(_one_line(exc)) from exc

    async def list_sessions(ctx: Context) -> str:
        registry = _registry(ctx)
        sessions = registry.describe() + registry.detached()
        return json.dumps({"sessions": sessions, "warm": registry.warm_kernels})

    async def close_session(session: str, ctx: Context) -> str:
        closed = await _registry(ctx).close(_check_session(session))
        return f"closed session {session!r}" if closed else f"no open session {session!r}"

    async def export_notebook(session: str, ctx: Context, path: str | None = None) -> CallToolResult:
        own = _settings(ctx)  # an HTTP client's journals and exports are its namespace's
        _check_ref(session)  # a name (its current generation), or NAME@N for an older one
        if path is None:  # never the notebook itself: megabytes the model's context cannot take
            return export_result(
                session, await notebook_summary(own, session, _reader(ctx)), notebook_uri(session), None
            )
        facts, written = await export_to_file(own, session, path, _reader(ctx))
        # The host path for the host's own user (stdio); a remote token's client, to whom the
        # bridge's directories are nobody's business, gets the path inside its export directory.
        shown = str(written) if namespace_of(ctx) == "" else str(written.relative_to(export_root(own)))
        return export_result(session, facts, notebook_uri(session), shown)

    tools = [
        compact_tool(run_python, RUN_PYTHON_DOC, structured_output=False),
        compact_tool(list_sessions, "List open sessions."),
        compact_tool(close_session, "Close a session; removes its sandbox."),
        compact_tool(
            export_notebook,
            "Write a session's history as .ipynb to path, or say where it is; NAME@N: generation N.",
        ),
    ]
    lifespan = starting(open_bridge, settings)  # initialize is answered while the bridge starts
    tasks = TaskExtension(_task_bridge)
    app: MCPServer[BridgeContext] = MCPServer(
        "kernelbridge",
        version=__version__,
        lifespan=lifespan,
        tools=tools,
        log_level="WARNING",
        extensions=[tasks],
    )
    app.middleware.append(start_gate)  # requests that need the bridge wait for its start
    app.middleware.append(tasks.middleware)  # after the start: it needs the bridge

    @app.resource("kernelbridge://capabilities", name="capabilities", mime_type="text/markdown")
    def capabilities() -> str:
        if not hubs:
            return render_manual() + facts.markdown(settings)
        hub = hubs[-1]
        servers = [ServerLine(s["name"], s["alias"], s["description"]) for s in hub.summaries()]
        return render_manual(servers, hub.problems()) + facts.markdown(settings)

    @app.resource(
        "kernelbridge://sessions/{session}/notebook",
        name="session-notebook",
        description="A session's history as an .ipynb notebook",
        mime_type="application/x-ipynb+json",
    )
    async def session_notebook(session: str, ctx: Context) -> str:
        try:
            return await notebook_for_resource(_settings(ctx), _check_ref(session), _reader(ctx))
        except ToolError as exc:  # a resource answers its own kind of error (else the SDK logs a bug)
            raise ResourceError(str(exc)) from None

    register_file_resources(app, _registry)
    register_output_resources(app, _settings, _reader)

    return app


RUN_PYTHON_DOC = (
    "Run Python in a persistent sandboxed IPython session (state kept per session). "
    "Manual: kernelbridge://capabilities"
)


async def _rendered(result: CellResult, settings: Settings) -> CallToolResult:
    """A cell's result as the tool's: its images fitted to the budget (the rest said in notes)."""
    fitted = await fit_images(result.images, result.session, settings.image_budget)
    result.notes.extend(fitted.notes)
    return to_tool_result(result, media=fitted.blocks)


async def _collect(run: CallRun, ctx: Context, bridge: BridgeContext) -> CallToolResult | InputRequiredResult:
    """Wait for ``run``'s cell on this request (asking its questions the client's way); its tool
    result, or the InputRequiredResult a 2026-07-28 client must answer first. A request cancelled
    while it waits (and not detached for a retry) cancels the cell, as a call always did."""
    try:
        asking = await drive(run, ctx, bridge.runs)
    except BaseException:
        if not run.detached:
            run.scope.cancel()
        raise
    if asking is not None:
        return asking
    bridge.runs.drop(run)
    if isinstance(run.error, KernelBridgeError):
        raise ToolError(_one_line(run.error)) from run.error
    if run.error is not None:
        raise run.error
    return cast(CallToolResult, run.outcome)


def _task_bridge(ctx: ServerRequestContext[Any, Any]) -> Bridge:
    """What the task methods see of the bridge, for the namespace of ``ctx``'s client."""
    bridge = cast(BridgeContext, ctx.lifespan_context)
    namespace = namespace_of_request(ctx.request)
    try:
        registry = bridge.namespaces.registry(namespace)
    except KernelBridgeError as exc:
        raise MCPError(code=INVALID_PARAMS, message=_one_line(exc)) from None
    assert bridge.tasks is not None

    def running(session: str) -> dict[str, Any] | None:
        found = registry.session(session)
        return found.running.listing(time.monotonic()) if found is not None and found.running else None

    return Bridge(bridge.tasks, bridge.runs, namespace, running, bridge.settings.max_task_time)


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _sandbox_image(settings: Settings, *, testing: bool) -> tuple[str, str | None]:
    """The image and agent for an injected test runtime (the local double has no images)."""
    if testing and not settings.image:
        return "test-double", None  # an injected runtime (the local test double) has no images
    from kernelbridge.host.policy import expected_image

    return expected_image(settings)


async def _can_reattach(runtime: RuntimeBackend) -> bool:
    """Whether sandboxes may outlive this bridge on ``runtime`` (``RuntimeInfo.reattach``)."""
    try:
        with anyio.fail_after(30):
            return (await runtime.info()).reattach
    except (KernelBridgeError, TimeoutError):
        return False


async def _reap_orphans(runtime: RuntimeBackend, settings: Settings) -> None:
    """Remove containers left by bridges that were SIGKILLed (best effort: never blocks serving);
    not the durable sandboxes this state directory's records name (their sessions adopt them)."""
    from kernelbridge.host.container import state_identity
    from kernelbridge.runtime.reaper import reap_orphans

    try:
        spare = await anyio.to_thread.run_sync(adoptable_containers, settings.state_dir)
        with anyio.fail_after(30):
            removed = await reap_orphans(runtime, spare, state_identity(settings.state_dir))
        if removed:
            log.warning("removed %d sandbox container(s) left by a dead kernelbridge", removed)
    except KernelBridgeError as exc:  # e.g. the daemon is down: said once more, per call, by the gate
        log.warning("reaping orphaned sandboxes failed: %s", exc)
    except Exception:
        log.warning("reaping orphaned sandboxes failed", exc_info=True)


def serve(settings: Settings, *, http: HttpOptions | None = None) -> None:
    """Run the MCP server until the client disconnects or a signal arrives.

    ``http`` serves streamable HTTP (see :mod:`kernelbridge.server.http`): each token's clients get
    a namespace of their own; without tokens (loopback only) all clients share one.
    """
    try:
        check_state_dir(settings)
    except ConfigError as exc:
        if http is not None:  # an operator's terminal: one line and exit 1
            raise
        settings = with_problem(settings, str(exc))  # over stdio: said by every call instead
    departure = Departure()
    if http is None:
        anyio.run(serve_stdio, build_server(settings, departure=departure), departure)
        return
    names = http.tokens.namespaces if http.tokens is not None else None
    app = build_server(settings, namespaces=names, departure=departure)
    anyio.run(serve_http, app, http, departure)


@dataclass(slots=True)
class HostFacts:
    """What the capabilities resource says about this host, beyond the manual: filled by the
    lifespan from the bridge's :class:`SandboxPolicy`."""

    policy: SandboxPolicy | None = None

    def markdown(self, settings: Settings) -> str:
        policy = self.policy
        if policy is None:
            return ""
        limits = settings.limits
        lines = ["", "## This host", ""]
        if policy.refusal:
            lines.append(f"- Sandboxes cannot start right now: {policy.refusal}.")
        elif policy.unlimited:
            lines.append(
                "- Limits are NOT enforced here: the container runtime ignores memory and process"
                " limits (the operator allowed it). A runaway cell can exhaust the host's memory."
            )
        else:
            lines.append(
                f"- Limits: memory {limits.memory}, {limits.pids} processes, {limits.cpus:g} CPU;"
                f" /workspace {limits.workspace_size}, /tmp {limits.tmp_size}."
            )
        if settings.approve_tools:
            patterns = ", ".join(f"`{p}`" for p in settings.approve_tools[:10])
            lines.append(
                f"- Host calls of {patterns} wait for the user's approval (asked by the MCP client);"
                " a refusal raises `McpToolDenied`: do not retry it, say what you wanted to do."
            )
        packages = settings.packages
        section = packages_section(
            policy.packages,
            packages.policy,
            sorted(packages.allowed),
            packages.max_bytes,
            packages.max_installs,
            [mount.target for mount in settings.mounts],
        )
        return "\n".join(lines) + "\n\n" + section
