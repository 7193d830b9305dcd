"""``run_python`` as an MCP task (2025-11-25 task-augmented ``tools/call``), for jobs longer than a call.

A client that declares nothing sees no change. A task-augmented ``run_python`` gets a
``CreateTaskResult`` at once; the ordinary call runs as a :class:`~kernelbridge.server.approval.RunTable`
task, its cell allowed up to ``KERNELBRIDGE_MAX_TASK_TIME``, served by ``tasks/get|result|cancel|list``.
Tasks are records of a namespace in its state directory (``tasks/<id>.json``): another token's task
id is unknown, in the same line as one that never existed. A new bridge answers a task that ended
with its stored result and takes over one still running in a session it inherits; one it cannot
follow is ``failed``, with a line naming the session whose journal has its outcome.
Design: docs/design/server.md.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import os
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from kernelbridge.runtime.reaper import pid_alive, process_start

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from kernelbridge.server.approval import RunTable

    Resume = Callable[["TaskRecord", "TaskStore", str], None]
    """Takes over a task whose bridge left (the record, its store, the line if it cannot be)."""

log = logging.getLogger(__name__)

TOOL = "run_python"
"""The one tool that may run as a task."""
DEFAULT_TTL_MS = 24 * 3600 * 1000
"""How long a task's record is kept from its creation when the client asks for no ttl."""
MAX_TTL_MS = 7 * 24 * 3600 * 1000
"""The longest ttl granted (a client may ask for less)."""
MAX_TASKS = 256
"""Records a namespace keeps; past it the oldest ended ones go first."""
POLL_INTERVAL_MS = 2000
"""The polling interval suggested to clients (the cell's progress is sampled every 2 s)."""
TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_ID_ECHO = 80
RELATED = "io.modelcontextprotocol/related-task"
Context = ServerRequestContext[Any, Any]
TERMINAL = frozenset({"completed", "failed", "cancelled"})
VERSIONS = frozenset({"2025-11-25"})
"""The protocol versions whose tasks these are (2026-07-28 moved tasks to an extension of another
shape, not served here yet: its clients see no tasks)."""

CURRENT: contextvars.ContextVar[TaskRecord | None] = contextvars.ContextVar("kernelbridge_task", default=None)
"""The task whose ``tools/call`` runs in this context (set for the handler the task runs)."""


def current_task() -> TaskRecord | None:
    """The task the running ``run_python`` call belongs to, or None for an ordinary call."""
    return CURRENT.get()


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def unknown_task(task_id: str) -> MCPError:
    shown = task_id if len(task_id) <= MAX_ID_ECHO else task_id[:MAX_ID_ECHO] + "..."
    return MCPError(
        code=types.INVALID_PARAMS,
        message=f"no task {shown!r} here (unknown, expired, or another token's); run_python again if needed",
    )


@dataclass(eq=False)
class TaskRecord:
    """One task: what ``tasks/get`` says of it and, once it ended, its result."""

    task_id: str
    namespace: str
    session: str
    created: float
    """Epoch seconds."""
    ttl_ms: int
    status: str = "working"
    message: str | None = None
    updated: float = 0.0
    result: dict[str, Any] | None = None
    """The ``tools/call`` result's wire form, once it ended."""
    error: str | None = None
    """Why there is no result (cancelled; its bridge left): one line."""
    bridge: int = field(default_factory=os.getpid)
    """The process that runs it (a record of a process that is gone is followed by the next)."""
    bridge_start: int | None = field(default_factory=lambda: process_start(os.getpid()))
    """When that process started (:func:`process_start`): a later process given the same pid
    is not it."""
    cell: str = field(default_factory=lambda: uuid.uuid4().hex)
    """The msg_id of its cell: a bridge after the one that sent it follows the cell by it."""
    timeout: float = 0.0
    """Its cell's timeout, seconds from its creation (0: unknown)."""
    started: float = field(default_factory=time.monotonic)
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    live: bool = True
    """Run by this bridge (not read back from a record another process left)."""
    cancelling: bool = False
    """``tasks/cancel`` asked for it (else a cancellation is the bridge leaving)."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def label(self) -> str:
        """What runs its cell, as the calls queued behind it are told."""
        return f"task {self.task_id}"

    def expired(self, now: float) -> bool:
        return now > self.created + self.ttl_ms / 1000

    def task(self, message: str | None = None) -> types.Task:
        return types.Task(
            task_id=self.task_id,
            status=self.status,  # type: ignore[arg-type]
            status_message=message if message is not None else self.message,
            created_at=_iso(self.created),
            last_updated_at=_iso(self.updated or self.created),
            ttl=self.ttl_ms,
            poll_interval=POLL_INTERVAL_MS,
        )

    def end(self, status: str, *, result: dict[str, Any] | None = None, error: str | None = None) -> None:
        if self.terminal:
            return
        self.status, self.result, self.error = status, result, error
        self.updated = time.time()
        elapsed = time.monotonic() - self.started
        self.message = error or f"{status} after {elapsed:.0f} s"
        self.done.set()

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "session": self.session,
            "created": self.created,
            "ttl_ms": self.ttl_ms,
            "status": self.status,
            "message": self.message,
            "updated": self.updated,
            "result": self.result,
            "error": self.error,
            "bridge": self.bridge,
            "bridge_start": self.bridge_start,
            "cell": self.cell,
            "timeout": self.timeout,
        }

    @classmethod
    def from_json(cls, namespace: str, data: dict[str, Any]) -> TaskRecord:
        record = cls(
            task_id=str(data["task_id"]),
            namespace=namespace,
            session=str(data["session"]),
            created=float(data["created"]),
            ttl_ms=int(data["ttl_ms"]),
            status=str(data["status"]),
            message=data.get("message") if isinstance(data.get("message"), str) else None,
            updated=float(data.get("updated") or 0.0),
            result=data.get("result") if isinstance(data.get("result"), dict) else None,
            error=data.get("error") if isinstance(data.get("error"), str) else None,
            bridge=int(data.get("bridge") or 0),
            bridge_start=data["bridge_start"] if isinstance(data.get("bridge_start"), int) else None,
            cell=str(data.get("cell") or ""),
            timeout=float(data.get("timeout") or 0.0),
            live=False,
        )
        # Its elapsed time goes on from when it was created (monotonic clocks are per process).
        record.started = time.monotonic() - max(0.0, time.time() - record.created)
        if record.status not in TERMINAL and record.status != "working":
            raise ValueError(f"status {record.status!r}")
        if record.terminal:
            record.done.set()
        return record


class TaskStore:
    """The task records of one namespace: in memory while this bridge runs them, on disk in its
    state directory (``tasks/``) so that another client, or another bridge, finds them by id."""

    def __init__(self, namespace: str, directory: Path, resume: Resume | None = None) -> None:
        self.namespace = namespace
        self.directory = directory
        self._resume = resume
        self._live: dict[str, TaskRecord] = {}

    def create(self, session: str, ttl_ms: int | None, timeout: float = 0.0) -> TaskRecord:
        now = time.time()
        ttl = DEFAULT_TTL_MS if ttl_ms is None else max(1000, min(int(ttl_ms), MAX_TTL_MS))
        record = TaskRecord(
            secrets.token_urlsafe(16), self.namespace, session, now, ttl, updated=now, timeout=timeout
        )
        self.prune(now)
        self._live[record.task_id] = record
        self.save(record)
        return record

    def find(self, task_id: str) -> TaskRecord | None:
        """The task ``task_id`` of this namespace, or None (unknown, expired, bad id)."""
        if not TASK_ID.fullmatch(task_id):
            return None
        record = self._live.get(task_id)
        if record is None:
            record = self._read(self.directory / f"{task_id}.json")
            if record is not None and record.status == "working" and not self._alive(record):
                self._take_over(record)
        if record is None or record.expired(time.time()):
            return None
        return record

    @staticmethod
    def _alive(record: TaskRecord) -> bool:
        """Whether the bridge that wrote ``record`` still runs. This bridge's own tasks are live
        records, never read back: a record of its pid is of a process before it (a container's
        bridge is pid 1 again after a restart)."""
        pid = record.bridge
        return pid > 0 and pid != os.getpid() and pid_alive(pid, record.bridge_start)

    def _take_over(self, record: TaskRecord) -> None:
        """A working record whose bridge left while its cell ran (the durable sandbox ran it on):
        this bridge follows the cell it inherited to its end, or says where its outcome is."""
        left = (
            f"the bridge running this task left before its cell ended, and this bridge did not inherit"
            f" it; the cell's outcome is in session {record.session!r}'s journal (export_notebook, or"
            " list_sessions)"
        )
        if self._resume is None or not record.cell:
            record.end("failed", error=left)
            self.save(record)
            return
        record.live, record.bridge, record.bridge_start = True, os.getpid(), process_start(os.getpid())
        self._live[record.task_id] = record
        self.save(record)
        self._resume(record, self, left)

    def records(self) -> list[TaskRecord]:
        """Every unexpired task of this namespace, newest first."""
        found: dict[str, TaskRecord] = {}
        if self.directory.is_dir():
            for path in sorted(self.directory.glob("*.json"))[: MAX_TASKS * 2]:
                record = self.find(path.stem)
                if record is not None:
                    found[record.task_id] = record
        for record in self._live.values():
            found[record.task_id] = record
        now = time.time()
        return sorted((r for r in found.values() if not r.expired(now)), key=lambda r: -r.created)

    def save(self, record: TaskRecord) -> None:
        """Write ``record`` (atomically); a failure is logged, the task goes on in memory."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.directory / f"{record.task_id}.json"
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(record.to_json()), encoding="utf-8")
            partial.replace(path)
        except OSError as exc:
            log.warning("task %s could not be recorded: %s", record.task_id, exc)

    def prune(self, now: float) -> None:
        """Drop expired records, and the oldest ended ones past :data:`MAX_TASKS` (working ones stay)."""
        for task_id, record in list(self._live.items()):
            if record.terminal and record.expired(now):
                del self._live[task_id]
        if not self.directory.is_dir():
            return
        ended: list[tuple[float, str, Path]] = []
        count = 0
        for path in self.directory.glob("*.json"):
            found = self._live.get(path.stem)
            found = found if found is not None else self._read(path)
            if found is None or found.expired(now):
                path.unlink(missing_ok=True)
                continue
            count += 1
            if found.terminal or not found.live:
                ended.append((found.created, found.task_id, path))
        ended.sort()
        for _, task_id, path in ended[: max(0, count - MAX_TASKS + 1)]:
            path.unlink(missing_ok=True)
            self._live.pop(task_id, None)

    def _read(self, path: Path) -> TaskRecord | None:
        try:
            if path.stat().st_size > 64 * 1024 * 1024:
                return None
            data = json.loads(path.read_text(encoding="utf-8"))
            return TaskRecord.from_json(self.namespace, data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("task record %s is unreadable: %s", path.name, exc)
            return None


class TaskTable:
    """Every namespace's :class:`TaskStore` of a bridge; ``directory(namespace)`` says where;
    ``resume`` takes over a task whose bridge left while it ran (see :meth:`TaskStore.find`)."""

    def __init__(self, directory: Callable[[str], Path], resume: Resume | None = None) -> None:
        self._directory = directory
        self._resume = resume
        self._stores: dict[str, TaskStore] = {}

    def store(self, namespace: str) -> TaskStore:
        store = self._stores.get(namespace)
        if store is None:
            directory = self._directory(namespace) / "tasks"
            store = self._stores[namespace] = TaskStore(namespace, directory, self._resume)
        return store

    def take_over(self, namespace: str) -> None:
        """Follow every task of ``namespace`` that a bridge before left running (at start: so
        that the calls behind it queue as they did before)."""
        self.store(namespace).records()

    def find(self, namespace: str, task_id: str) -> TaskRecord:
        record = self.store(namespace).find(task_id)
        if record is None:
            raise unknown_task(task_id)
        return record


def status_message(record: TaskRecord, running: dict[str, Any] | None) -> str | None:
    """A working task's status: elapsed time and the cell's latest output line (or that it queues)."""
    if record.terminal:
        return record.message
    elapsed = time.monotonic() - record.started
    if running is None:
        return f"waiting to start, {elapsed:.0f} s"
    if running.get("task") != record.label:
        return f"queued behind {running.get('task') or 'another call'} for {elapsed:.0f} s"
    line = running.get("latest_output") or ""
    return f"running {running.get('seconds', 0)} s" + (f"; latest output: {line}" if line else "")


class TaskExtension(Extension):
    """The task methods (``tasks/get``, ``tasks/result``, ``tasks/cancel``, ``tasks/list``) and the
    middleware that starts tasks. ``bridge(ctx)`` gives what a request's handlers see:
    ``(tasks, runs, namespace, running)`` where ``running(namespace, session)`` is the session's
    ``list_sessions`` ``running`` entry or None."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self, bridge: Callable[[ServerRequestContext[Any, Any]], Bridge]) -> None:
        self._bridge = bridge

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", types.GetTaskRequestParams, self._get, VERSIONS),
            MethodBinding("tasks/result", types.GetTaskPayloadRequestParams, self._result, VERSIONS),
            MethodBinding("tasks/cancel", types.CancelTaskRequestParams, self._cancel, VERSIONS),
            MethodBinding("tasks/list", types.PaginatedRequestParams, self._list, VERSIONS),
        )

    async def _get(self, ctx: Context, params: types.GetTaskRequestParams) -> HandlerResult:
        bridge = self._bridge(ctx)
        record = bridge.tasks.find(bridge.namespace, params.task_id)
        return types.GetTaskResult(**_fields(record.task(bridge.message(record))))

    async def _result(self, ctx: Context, params: types.GetTaskPayloadRequestParams) -> HandlerResult:
        bridge = self._bridge(ctx)
        record = bridge.tasks.find(bridge.namespace, params.task_id)
        await record.done.wait()
        if record.result is None:
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"task {record.task_id} has no result: {record.error}"
            )
        meta = dict(record.result.get("_meta") or {})
        meta[RELATED] = {"taskId": record.task_id}
        return {**record.result, "_meta": meta}

    async def _cancel(self, ctx: Context, params: types.CancelTaskRequestParams) -> HandlerResult:
        bridge = self._bridge(ctx)
        record = bridge.tasks.find(bridge.namespace, params.task_id)
        if record.terminal:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"task {record.task_id} cannot be cancelled: it is {record.status}",
            )
        if not record.live:  # pragma: no cover - a working record read back is ended by find()
            raise unknown_task(params.task_id)
        record.cancelling = True
        record.scope.cancel()
        with anyio.fail_after(60):  # the cell is interrupted (bounded by the runner's grace)
            await record.done.wait()
        return types.CancelTaskResult(**_fields(record.task()))

    async def _list(self, ctx: Context, params: types.PaginatedRequestParams) -> HandlerResult:
        bridge = self._bridge(ctx)
        records = bridge.tasks.store(bridge.namespace).records()[:100]
        return types.ListTasksResult(tasks=[r.task(bridge.message(r)) for r in records])

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Server middleware: a task-augmented ``run_python`` becomes a task; ``initialize`` says
        the server has tasks and ``tools/list`` that ``run_python`` may be one."""
        if ctx.method == "initialize":
            return _with_capability(await call_next(ctx))
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await call_next(ctx)
        if ctx.method == "tools/list":
            return _with_task_support(await call_next(ctx))
        params = ctx.params or {}
        if (
            ctx.method != "tools/call"
            or not isinstance(params.get("task"), dict)
            or params.get("name") != TOOL
        ):
            return await call_next(ctx)
        bridge = self._bridge(ctx)
        arguments = params.get("arguments")
        session = arguments.get("session", "default") if isinstance(arguments, dict) else "default"
        ttl = params["task"].get("ttl")
        # The call as an ordinary one (its result is run_python's), without the task field or a
        # progress token (its request has been answered: nobody would hear progress about it).
        meta = {k: v for k, v in (params.get("_meta") or {}).items() if k != "progressToken"}
        plain = {k: v for k, v in params.items() if k not in ("task", "_meta")}
        if isinstance(arguments, dict) and "timeout" not in arguments:  # a task's default: its maximum
            plain["arguments"] = {**arguments, "timeout": int(bridge.max_task_time)}
        asked = (plain.get("arguments") or {}).get("timeout") if isinstance(arguments, dict) else None
        timeout = float(asked) if isinstance(asked, int | float) else bridge.max_task_time
        store = bridge.tasks.store(bridge.namespace)
        record = store.create(str(session)[:200], ttl if isinstance(ttl, int) else None, timeout)
        if meta:
            plain["_meta"] = meta
        inner = dataclasses.replace(ctx, params=plain, meta=None)

        async def call() -> dict[str, Any]:
            answer = await call_next(inner)
            return answer if isinstance(answer, dict) else _dump(answer)

        async def run() -> None:
            await run_task(record, store, call)

        bridge.runs.spawn(run)
        return types.CreateTaskResult(task=record.task("started")).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )


async def run_task(
    record: TaskRecord, store: TaskStore, call: Callable[[], Awaitable[dict[str, Any] | None]], left: str = ""
) -> None:
    """Run ``call`` (the task's ``tools/call`` chain, or the following of its inherited cell) as
    ``record``'s task: it ends completed, failed or cancelled, and is saved; unless the bridge
    is leaving, when its record stays ``working`` for the next bridge to follow. ``call`` gives
    None: there was nothing to follow (``left`` says why)."""
    CURRENT.set(record)
    result: dict[str, Any] | None = None
    with record.scope:
        try:
            result = await call()
            if result is None:
                record.end("failed", error=left or "the task's cell was not found")
        except MCPError as exc:
            record.end("failed", error=str(exc.error.message).splitlines()[0])
        except Exception as exc:
            log.warning("task %s failed", record.task_id, exc_info=True)
            record.end("failed", error=f"the call failed: {type(exc).__name__}")
    if record.scope.cancelled_caught and not record.cancelling:
        return  # the bridge is leaving: its record stays "working" for the next one to follow
    if record.scope.cancelled_caught:
        record.end(
            "cancelled",
            error="cancelled: the cell was interrupted (the session kept its variables unless"
            " list_sessions says otherwise); its outputs so far are in the session's journal",
        )
    elif result is not None:
        record.end("failed" if result.get("isError") else "completed", result=result)
    store.save(record)


@dataclass(frozen=True, slots=True)
class Bridge:
    """What the task handlers need of a request's bridge."""

    tasks: TaskTable
    runs: RunTable
    namespace: str
    running: Callable[[str], dict[str, Any] | None]
    """A session's ``running`` entry of ``list_sessions`` (None: it runs nothing now)."""
    max_task_time: float

    def message(self, record: TaskRecord) -> str | None:
        return status_message(record, None if record.terminal else self.running(record.session))


def _fields(task: types.Task) -> dict[str, Any]:
    return {name: getattr(task, name) for name in types.Task.model_fields}


def _dump(value: HandlerResult) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return value.model_dump(by_alias=True, mode="json", exclude_none=True)


def _with_capability(result: HandlerResult) -> HandlerResult:
    wire = _dump(result)
    capabilities = wire.get("capabilities")
    if isinstance(capabilities, dict):
        capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    return wire


def _with_task_support(result: HandlerResult) -> HandlerResult:
    wire = _dump(result)
    for tool in wire.get("tools") or []:
        if isinstance(tool, dict) and tool.get("name") == TOOL:
            tool["execution"] = {"taskSupport": "optional"}
    return wire
