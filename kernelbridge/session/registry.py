"""The session registry: named, stateful sandboxes with ordered calls, timeouts and a warm pool.

It owns the lifecycle of every sandbox the bridge starts: create on first use (from the warm pool
when one is ready), one ``run_python`` call at a time per session (an ``anyio.Lock``; different
sessions run in parallel), host MCP grants per session, the timeout policy, death detection,
idle reaping and teardown. It knows nothing about MCP: :mod:`kernelbridge.server` calls
:meth:`SessionRegistry.run` and renders the :class:`~kernelbridge.session.cell.CellResult`.

Each session has a :class:`~kernelbridge.session.recorder.Recorder` reading its kernel's iopub
continuously, so cells sent by any Jupyter client (a person in ``kernelbridge attach``) are
journalled too, and an :class:`~kernelbridge.session.broker.RpcBroker` for its code's host MCP calls.

Sandboxes come from an injected :class:`~kernelbridge.runtime.RuntimeBackend`: the product uses a
container engine; tests may use the local test double.

While a session is live its record ``<state_dir>/sessions/<name>.session.json`` tells other
processes (``kernelbridge sessions``, ``attach``) where its connection file is.

Timeouts (every wait on this path is bounded by the call's deadline plus :data:`TIMEOUT_GRACE`):
the clock starts when the kernel begins the cell (not while it waits behind another client's
cell). A cell that overran is interrupted (SIGINT to the kernel's process group, through the
agent); most code stops within :data:`INTERRUPT_GRACE`, and the session keeps its variables. Code
that swallows KeyboardInterrupt, or is stuck in C, does not; the only honest way to free the
session is to restart the kernel inside its container (files stay), and the result says
``state: lost``. If even that does not finish within the grace, the sandbox is discarded (files
gone, said so) and the next call starts a fresh one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from kernelbridge import frames
from kernelbridge.config import HTTP_DIR, Settings
from kernelbridge.errors import NO_SERVERS_CONFIGURED, NoHostServers, SandboxError, SessionError
from kernelbridge.host import Sandbox, SandboxHandlers, WarmPool, close_sandbox
from kernelbridge.hub.rpc import RpcCall, RpcHandler
from kernelbridge.notebook.journal import Journal, disk_use, journal_path
from kernelbridge.runtime import RuntimeBackend, pid_alive
from kernelbridge.session.broker import RpcBroker
from kernelbridge.session.cell import Cell, CellResult, State, Status, finish_cell
from kernelbridge.session.recorder import Recorder
from kernelbridge.tunnel import RpcRequest

log = logging.getLogger(__name__)

ProgressCallback = Callable[[float, str], Awaitable[None]]
"""Called with (seconds elapsed, latest output lines) while a cell runs."""
GrantCheck = Callable[[list[str]], list[str]]
"""Validates server names for ``servers=[...]`` (the hub); returns canonical names or raises."""

SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Session names end up in container names and file paths: no slashes, no leading dot."""
INTERRUPT_GRACE = 3.0
"""Seconds an interrupted cell gets to finish before the kernel is restarted."""
TIMEOUT_GRACE = 12.0
"""Bound on everything after a call's deadline (interrupt, grace, restart): a timeout=8 call
returns within 8 + 12 s whatever state the sandbox is in."""
TEARDOWN_TIMEOUT = 25.0
"""Bound on stopping every sandbox at exit; they stop in parallel."""
TICK = 1.0
"""Longest wait between checks of a running cell (progress, the session being closed)."""
PROGRESS_EVERY = 2.0
"""Seconds between progress notifications of a long cell."""
REFRESH_TIMEOUT = 30.0
"""Bound on rebinding the host-MCP proxies in the kernel after a grant or a restart."""
QUOTA_SETTING = "KERNELBRIDGE_HTTP_DISK_QUOTA"
REFRESH_CODE = "__import__('mcp')._kernelbridge_refresh()"
"""Sent as a silent request: rebinds ``mcp_<alias>`` proxies for the session's grants."""


def validate_session_name(name: object) -> str:
    """Return ``name`` if it is a valid session name; raise SessionError saying why not."""
    if not isinstance(name, str) or not SESSION_NAME.match(name):
        raise SessionError(
            f"invalid session name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )
    return name


@dataclass(eq=False)
class Session:
    name: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    sandbox: Sandbox | None = None
    recorder: Recorder | None = None
    broker: RpcBroker | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    journal: Journal | None = None
    grants: frozenset[str] = frozenset()
    needs_refresh: bool = False
    """The kernel's mcp proxies do not reflect ``grants`` yet (new grant, or a fresh kernel)."""
    dead: str | None = None
    """Why the sandbox died, until the next call starts a fresh one."""
    closed: bool = False
    busy: bool = False
    journal_failed: bool = False
    """A journal write failed and the session was told so (once)."""
    journal_truncated: bool = False
    """The journal reached its byte budget and the session was told so (once)."""
    notes: list[str] = field(default_factory=list)
    """Sentences for the next result (e.g. that the kernel was replaced)."""

    def __repr__(self) -> str:
        state = "closed" if self.closed else "dead" if self.dead else "busy" if self.busy else "idle"
        return f"<Session {self.name!r} {state}>"


@dataclass(eq=False)
class _Seat:
    """A sandbox this registry started, with the handlers it was started with (pooled together):
    its iopub and replies go to the recorder, its rpc requests to the broker, of the session it
    was given to; until a session takes it from the warm pool, to nobody."""

    sandbox: Sandbox
    recorder: Recorder | None = None
    broker: RpcBroker | None = None

    def handlers(self) -> SandboxHandlers:
        return SandboxHandlers(self._on_iopub, self._on_reply, self._on_rpc, self._on_end)

    async def _on_iopub(self, msg: dict[str, Any]) -> None:
        if self.recorder is not None:
            await self.recorder.on_iopub(msg)

    def _on_reply(self, msg: dict[str, Any]) -> None:
        if self.recorder is not None:
            self.recorder.on_reply(msg)

    async def _on_rpc(self, request: RpcRequest) -> None:
        if self.broker is not None:
            await self.broker.on_request(request.to_frame())
        else:
            await self.sandbox.agent.answer_rpc(request.id, error=NoHostServers().to_wire())

    def _on_end(self) -> None:
        if self.recorder is not None:
            self.recorder.wake_all()


class SessionRegistry:
    """All sessions of one bridge. Use as ``async with SessionRegistry(...) as registry``."""

    def __init__(
        self,
        settings: Settings,
        runtime: RuntimeBackend,
        *,
        image: str,
        agent_hash: str | None,
        dispatch: RpcHandler | None = None,
        check_grants: GrantCheck | None = None,
    ) -> None:
        self.settings = settings
        self.runtime = runtime
        self.image = image
        self.agent_hash = agent_hash
        self._dispatch = dispatch
        self._check_grants = check_grants
        self._sessions: dict[str, Session] = {}
        self._pool: WarmPool[_Seat] = WarmPool(
            settings.warm_pool, self._start_sandbox, settings.kernel_start_timeout
        )
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> SessionRegistry:
        self.settings.sessions_dir.mkdir(parents=True, exist_ok=True)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._pool.run)
        self._tg.start_soon(self._reap_idle)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    async def aclose(self) -> None:
        """Stop every sandbox and pooled sandbox, in parallel, shielded and bounded."""
        sessions, self._sessions = list(self._sessions.values()), {}
        pool = self._pool.drain()
        with anyio.CancelScope(shield=True), anyio.move_on_after(TEARDOWN_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(self._close_session, session)
                for seat in pool:
                    tg.start_soon(close_sandbox, seat.sandbox)

    async def _start_sandbox(self, name: str) -> _Seat:
        assert self._tg is not None
        sandbox = Sandbox.create(
            self.settings, self.runtime, name, image=self.image, agent_hash=self.agent_hash
        )
        seat = _Seat(sandbox)
        await self._tg.start(partial(sandbox.run, seat.handlers()))
        return seat

    # -- queries -----------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "session": s.name,
                "state": "dead" if s.dead else "busy" if s.busy else "idle" if s.sandbox else "starting",
                "cells": s.journal.cells if s.journal else 0,
                "idle_seconds": 0 if s.busy else round(now - s.last_used),
                "container": s.sandbox.container_name if s.sandbox else None,
                "servers": sorted(s.grants),
            }
            for s in self._sessions.values()
        ]

    @property
    def warm_kernels(self) -> int:
        """Started sandboxes waiting in the pool for a new session."""
        return len(self._pool)

    def journal_file(self, name: str) -> Path:
        return journal_path(self.settings.sessions_dir, validate_session_name(name))

    def session(self, name: str) -> Session | None:
        return self._sessions.get(name)

    # -- running code ------------------------------------------------------------------------

    async def run(
        self,
        name: str,
        code: str,
        *,
        timeout: float,
        servers: list[str] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> CellResult:
        """Run ``code`` in session ``name`` (created on first use); calls to one session queue.

        ``servers`` are granted to the session for its lifetime (host MCP servers its code may
        call). Raises SessionError (bad name, too many sessions, unknown server) and
        SandboxError/ImageError when a sandbox cannot be started. A user's Python error is a
        normal result.
        """
        validate_session_name(name)
        granted = self._grants_for(servers or [])
        while True:
            session = self._session_for(name)
            async with session.lock:
                if session.closed:
                    continue  # closed while we queued: the next loop creates a fresh one
                session.busy = True
                try:
                    await self._ensure_sandbox(session)
                    began = time.monotonic()  # waits from here on count against the timeout
                    if not granted <= session.grants:
                        session.grants |= granted
                        session.needs_refresh = True
                    if session.needs_refresh:
                        await self._refresh_proxies(session, timeout)
                    return await self._execute(session, code, timeout, on_progress, began)
                finally:
                    session.busy = False
                    session.last_used = time.monotonic()

    async def sandbox(self, name: str) -> Sandbox:
        """The live sandbox of session ``name`` (created on first use, replaced if it died), e.g.
        to place files before a call. Raises as :meth:`run` does."""
        validate_session_name(name)
        while True:
            session = self._session_for(name)
            async with session.lock:
                if session.closed:
                    continue
                await self._ensure_sandbox(session)
                assert session.sandbox is not None
                return session.sandbox

    def _grants_for(self, servers: list[str]) -> frozenset[str]:
        if not servers:
            return frozenset()
        if self._check_grants is None:
            raise SessionError(f"unknown server {servers[0]!r}: {NO_SERVERS_CONFIGURED} for this bridge")
        return frozenset(self._check_grants(servers))

    def _session_for(self, name: str) -> Session:
        # Synchronous: checking the limit and publishing the session cannot interleave.
        session = self._sessions.get(name)
        if session is None:
            if len(self._sessions) >= self.settings.max_sessions:
                names = ", ".join(sorted(self._sessions))
                raise SessionError(
                    f"too many sessions: {len(self._sessions)} open ({names}), the maximum is "
                    f"{self.settings.max_sessions}; close one with close_session or reuse a session"
                )
            session = self._sessions[name] = Session(name)
        return session

    async def _ensure_sandbox(self, session: Session) -> None:
        """Give ``session`` a live sandbox: first use, or after its sandbox died or was discarded."""
        sandbox = session.sandbox
        if sandbox is not None and sandbox.alive and session.dead is None:
            return
        if sandbox is not None and session.dead is None:
            session.dead = sandbox.death.reason if sandbox.death else "the sandbox ended while idle"
        if session.journal is None:  # first use
            try:
                journal = await self._new_journal(session)  # before the sandbox: nothing to undo
                self._attach(session, await self._pool.take(session.name))
            except BaseException:
                if self._sessions.get(session.name) is session:
                    del self._sessions[session.name]
                session.closed = True
                raise
            session.journal = journal
            try:
                await anyio.to_thread.run_sync(session.journal.start)
            except OSError as exc:
                self._journal_failed(session, exc)
            self._write_record(session)
            return
        reason, session.dead = session.dead, None
        await self._replace_sandbox(session)
        why = f"The previous sandbox died ({reason})" if reason else "The previous sandbox was discarded"
        session.notes.append(
            f"{why}; this call started a fresh one: earlier variables, imports and files in "
            "/workspace are gone."
        )

    async def _new_journal(self, session: Session) -> Journal:
        """The session's journal, with its byte budget: ``KERNELBRIDGE_JOURNAL_BUDGET``, or what is
        left of the namespace's disk quota (HTTP tokens) when that is less."""
        budget, setting = self.settings.journal_budget, "KERNELBRIDGE_JOURNAL_BUDGET"
        if self.settings.disk_quota is not None:
            left = self.settings.disk_quota - await anyio.to_thread.run_sync(disk_use, self.settings)
            if left < budget:
                budget, setting = max(left, 0), QUOTA_SETTING
        return Journal(self.journal_file(session.name), session.name, budget=budget, setting=setting)

    def _attach(self, session: Session, seat: _Seat) -> None:
        """Make the seat's sandbox the session's: its recorder, rpc broker and journal hooks."""
        assert self._tg is not None
        sandbox = seat.sandbox
        broker = RpcBroker(
            session.name,
            self._dispatch or NO_HUB,
            sandbox.agent.answer_rpc,
            self._tg.start_soon,
            lambda: session.grants,
            namespace=self.settings.namespace,
        )

        def running(msg_id: str, running: bool) -> None:  # host calls are a running cell's only
            (broker.open_cell if running else broker.close_cell)(msg_id)

        recorder = Recorder(
            self.settings.output_limit,
            on_client_cell=lambda cell: self._journal_client(session, cell),
            client_execute=sandbox.client_execute,
            on_running=running,
        )
        seat.recorder, seat.broker = recorder, broker
        session.sandbox, session.recorder, session.broker = sandbox, recorder, broker
        session.needs_refresh = bool(session.grants)

    async def _refresh_proxies(self, session: Session, timeout: float = REFRESH_TIMEOUT) -> None:
        """Rebind the kernel's host-MCP proxies to the session's grants (a silent request), waiting
        at most ``timeout`` (the call's own: a wedged sandbox must not add REFRESH_TIMEOUT to it)."""
        assert session.sandbox is not None and session.recorder is not None and session.broker is not None
        msg_id = uuid.uuid4().hex
        session.recorder.ignore(msg_id)
        session.broker.open_cell(msg_id)  # the refresh asks the hub for the manifest
        try:
            await session.sandbox.kernel.execute(REFRESH_CODE, msg_id=msg_id, silent=True)
            reply = await session.sandbox.kernel.reply(msg_id, min(REFRESH_TIMEOUT, timeout))
        except SandboxError as exc:  # the call itself will meet the same sandbox and say so
            log.warning("session %s: refreshing the mcp proxies failed: %s", session.name, exc)
            return
        finally:
            session.broker.close_cell(msg_id)
        content = (reply or {}).get("content") or {}
        if content.get("status") == "ok":
            session.needs_refresh = False
            return
        why = f"{content.get('ename')}: {content.get('evalue')}" if content else "no answer"
        log.warning("session %s: refreshing the mcp proxies failed: %s", session.name, frames.clip(why, 300))
        session.notes.append(
            "The host MCP proxies (mcp_<server>) could not be refreshed in the kernel; "
            "`await runtime.call_tool(server, tool, arguments)` still works."
        )

    async def _execute(
        self,
        session: Session,
        code: str,
        timeout: float,
        on_progress: ProgressCallback | None,
        began: float | None = None,
    ) -> CellResult:
        sandbox, recorder, broker = session.sandbox, session.recorder, session.broker
        assert sandbox is not None and recorder is not None and broker is not None
        notes, session.notes = session.notes, []
        if (background := recorder.take_background()) is not None:
            notes.append(background)
        cell = recorder.expect(uuid.uuid4().hex, code)
        status: Status = "ok"
        state: State = "kept"
        try:
            try:
                await sandbox.kernel.execute(code, msg_id=cell.msg_id, wait=False)
            except SandboxError as exc:
                status, state = self._unreachable(session, str(exc), notes)
            else:
                status, state = await self._follow(session, cell, timeout, notes, on_progress, began)
        except BaseException:
            # Cancelled (the client gave up) or crashed: never leave the cell running behind the
            # lock, or the next call would silently queue behind it.
            with anyio.CancelScope(shield=True):
                if not cell.done and not session.closed and sandbox.alive:
                    state = await self._stop_overrun(session, cell)
                result = self._finish(session, cell, "cancelled", state, notes)
                await self._journal(session, code, result, timeout)
            raise
        finally:
            recorder.forget(cell)
        result = self._finish(session, cell, status, state, notes)
        await self._journal(session, code, result, timeout)
        return result

    async def _follow(
        self,
        session: Session,
        cell: Cell,
        timeout: float,
        notes: list[str],
        on_progress: ProgressCallback | None,
        began: float | None = None,
    ) -> tuple[Status, State]:
        """Wait for the cell, reporting progress; apply the timeout policy. Returns (status, state).

        The clock of a cell starts when the kernel begins it. Before that it may wait behind
        another client's cell (up to ``max_timeout``); but if it has not begun within ``timeout``
        while no other cell was running, the sandbox is not responding (paused, stopped, wedged)
        and the cell is treated as overrun, so the call still answers within timeout + grace.
        """
        sandbox, recorder = session.sandbox, session.recorder
        assert sandbox is not None and recorder is not None
        queue_deadline = cell.queued + self.settings.max_timeout
        last_progress = time.monotonic()
        other_busy_until = began if began is not None else cell.queued
        while not cell.done:
            now = time.monotonic()
            if session.closed:
                notes.append("The session was closed while this cell ran.")
                return "kernel_died", "lost"
            if not sandbox.alive:
                reason = sandbox.death.reason if sandbox.death else "the sandbox ended"
                session.dead = reason
                notes.append(
                    f"The sandbox died: {reason}. Its variables and its files in /workspace are lost; "
                    "the next call on this session starts a fresh sandbox."
                )
                return "kernel_died", "lost"
            if cell.started is not None:
                deadline = cell.started + timeout
            else:
                if recorder.busy_elsewhere(cell):
                    other_busy_until = now
                deadline = min(queue_deadline, other_busy_until + timeout)
            if now >= deadline:
                if cell.started is None and deadline < queue_deadline:
                    state = await self._stop_overrun(session, cell)
                    kept = session.sandbox is sandbox and sandbox.alive
                    notes.append(_unresponsive_note(timeout, state, files_kept=kept))
                    return "timeout", state
                if cell.started is None:
                    notes.append(
                        f"The kernel was busy with another client's cell for "
                        f"{self.settings.max_timeout:g} s; this cell never started "
                        "(it will run when the kernel is free)."
                    )
                    return "timeout", "kept"
                state = await self._stop_overrun(session, cell)
                notes.append(
                    _timeout_note(timeout, state, files_kept=session.sandbox is sandbox and sandbox.alive)
                )
                return "timeout", state
            if on_progress is not None and now - last_progress >= PROGRESS_EVERY:
                last_progress = now
                elapsed = now - (cell.started or cell.queued)
                await _report(on_progress, elapsed, cell.outputs.progress_tail())
            await cell.changed(min(deadline, now + TICK))
        if cell.waited_ms() > 1000:
            notes.append(f"This cell waited {cell.waited_ms() / 1000:.1f} s behind another client's cell.")
        return "ok", "kept"

    async def _stop_overrun(self, session: Session, cell: Cell) -> State:
        """Interrupt a cell that overran; restart the kernel if that does not stop it; discard
        the sandbox if even that does not finish within TIMEOUT_GRACE."""
        sandbox, broker = session.sandbox, session.broker
        assert sandbox is not None and broker is not None
        broker.cancel(cell.msg_id)
        with anyio.move_on_after(TIMEOUT_GRACE):
            await sandbox.interrupt()
            end = time.monotonic() + INTERRUPT_GRACE
            while not cell.done and sandbox.alive and time.monotonic() < end:
                await cell.changed(end)
            if cell.done:
                return "kept"
            broker.cancel()
            if await sandbox.restart(TIMEOUT_GRACE):
                session.needs_refresh = bool(session.grants)
                self._write_record(session)
                return "lost"
        log.warning("session %s: the sandbox did not restart in time; discarding it", session.name)
        self._discard(session)
        return "lost"

    def _unreachable(self, session: Session, reason: str, notes: list[str]) -> tuple[Status, State]:
        """The sandbox did not take the cell (it died, or its stdin is not drained): discard it."""
        sandbox = session.sandbox
        if sandbox is not None and not sandbox.alive:
            reason = sandbox.death.reason if sandbox.death else reason
            session.dead = reason
        else:
            self._discard(session)
        notes.append(
            f"The cell could not be sent: {reason}. The sandbox was discarded: its variables and its "
            "files in /workspace are lost; the next call on this session starts a fresh sandbox."
        )
        return "kernel_died", "lost"

    def _discard(self, session: Session) -> None:
        """Drop the session's sandbox now; it is closed in the background (bounded)."""
        sandbox, session.sandbox = session.sandbox, None
        session.dead = None
        if session.broker is not None:  # its calls answer a kernel that is gone: end them now
            session.broker.cancel()
        if sandbox is not None and self._tg is not None:
            self._tg.start_soon(close_sandbox, sandbox)
        session.needs_refresh = bool(session.grants)

    def _finish(
        self, session: Session, cell: Cell, status: Status, state: State, notes: list[str]
    ) -> CellResult:
        result = finish_cell(cell, session=session.name, status=status, state=state, notes=notes)
        if session.broker is not None:
            result.tool_calls = session.broker.take_records(cell.msg_id)
        result.waited_ms = cell.waited_ms() if cell.started is not None else 0
        return result

    async def _replace_sandbox(self, session: Session) -> None:
        old, session.sandbox = session.sandbox, None
        if session.broker is not None:
            # The old kernel's calls would hold this session's slots in the hub until they end.
            session.broker.cancel()
        if old is not None:
            await close_sandbox(old)
        try:
            self._attach(session, await self._pool.take(session.name))
        except BaseException:
            session.dead = "no sandbox could be started"
            session.sandbox = old  # keep something to report and to close later
            raise
        self._write_record(session)

    async def _journal(self, session: Session, code: str, result: CellResult, timeout: float) -> None:
        if session.journal is None:
            return
        try:
            await anyio.to_thread.run_sync(
                session.journal.append, code, result, sorted(session.grants), timeout
            )
        except OSError as exc:
            self._journal_failed(session, exc)
        self._journal_truncated(session, result.notes)

    async def _journal_client(self, session: Session, cell: Cell) -> None:
        if session.journal is None:
            return
        calls = session.broker.take_records(cell.msg_id) if session.broker is not None else []
        try:
            await anyio.to_thread.run_sync(session.journal.append_client_cell, cell, calls)
        except OSError as exc:
            self._journal_failed(session, exc)
        self._journal_truncated(session, session.notes)

    def _journal_truncated(self, session: Session, notes: list[str]) -> None:
        """Say once that the journal reached its budget (in ``notes``: this result's, or the next's)."""
        journal = session.journal
        if journal is None or not journal.truncated or session.journal_truncated:
            return
        session.journal_truncated = True
        log.warning("session %s: its journal reached its budget of %d bytes", session.name, journal.budget)
        if journal.setting == QUOTA_SETTING:
            quota = (self.settings.disk_quota or 0) / 2**20
            why = f"This client's files on the host reached their quota of {quota:.0f} MiB ({QUOTA_SETTING}"
        else:
            budget = journal.budget / 2**20
            why = f"The session's journal reached its budget of {budget:g} MiB ({journal.setting}"
        notes.append(
            f"{why}, set by the bridge's operator): this cell and later ones are not recorded, so the "
            "session's notebook (export_notebook) ends before them. The session itself goes on."
        )

    def _journal_failed(self, session: Session, exc: OSError) -> None:
        """A journal write failed (the state directory is full, or went away): the call goes on,
        and the session is told once that its notebook misses cells."""
        reason = exc.strerror or str(exc)
        log.warning("writing the journal of session %s failed: %s", session.name, reason)
        if not session.journal_failed:
            session.journal_failed = True
            session.notes.append(
                f"The session's journal could not be written ({reason}): its notebook "
                "(export_notebook) misses cells from here on."
            )

    # -- closing -----------------------------------------------------------------------------

    async def close(self, name: str) -> bool:
        """Close session ``name`` (stopping its sandbox, even mid-cell); False if it is not open."""
        session = self._sessions.pop(validate_session_name(name), None)
        if session is None:
            return False
        await self._close_session(session)
        return True

    async def _close_session(self, session: Session) -> None:
        session.closed = True
        if session.broker is not None:
            session.broker.cancel()
        if session.recorder is not None:
            session.recorder.wake_all()
        sandbox, session.sandbox = session.sandbox, None
        if sandbox is not None:
            await close_sandbox(sandbox)
        self._remove_record(session)

    async def _reap_idle(self) -> None:
        every = max(min(self.settings.idle_timeout / 4, 30.0), 0.25)
        while True:
            await anyio.sleep(every)
            cutoff = time.monotonic() - self.settings.idle_timeout
            for session in list(self._sessions.values()):
                if not session.lock.locked() and session.last_used < cutoff:
                    log.info("closing idle session %s", session.name)
                    if self._sessions.get(session.name) is session:
                        del self._sessions[session.name]
                    await self._close_session(session)

    # -- records -----------------------------------------------------------------------------

    def _record_path(self, session: Session) -> Path:
        return self.settings.sessions_dir / f"{session.name}.session.json"

    def _write_record(self, session: Session) -> None:
        if session.sandbox is None:
            return
        sandbox = session.sandbox
        record = {
            "name": session.name,
            "connection_file": str(sandbox.connection_file),
            "container": sandbox.container_name,
            "owner_pid": os.getpid(),
            "created": session.created,
        }
        path = self._record_path(session)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(record, indent=1))
            os.replace(tmp, path)
        except OSError as exc:  # only `kernelbridge sessions` and `attach` miss it
            log.warning("writing the record of session %s failed: %s", session.name, exc.strerror or exc)

    def _remove_record(self, session: Session) -> None:
        path = self._record_path(session)
        try:
            if json.loads(path.read_text()).get("owner_pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass


class _NoHub(RpcHandler):
    """The rpc handler of a registry given none: every call is refused ``unavailable``."""

    async def dispatch(self, call: RpcCall) -> object:
        raise NoHostServers(f"{NO_SERVERS_CONFIGURED} for this bridge")


NO_HUB = _NoHub()


def _timeout_note(timeout: float, state: State, files_kept: bool = False) -> str:
    if state == "kept":
        return f"Timed out after {timeout:g} s and was interrupted; the session's variables are kept."
    files = (
        " Files in /workspace are kept (same sandbox)."
        if files_kept
        else " The sandbox did not restart in time and was discarded: files in /workspace are gone too."
    )
    return (
        f"Timed out after {timeout:g} s and ignored the interrupt, so the kernel was restarted: "
        f"all variables and imports are lost.{files}"
    )


def _unresponsive_note(timeout: float, state: State, files_kept: bool) -> str:
    if state == "kept":
        return (
            f"The kernel did not begin this cell within {timeout:g} s; it was interrupted and "
            "the session's variables are kept."
        )
    files = (
        " Files in /workspace are kept (same sandbox)."
        if files_kept
        else (" It was discarded: files in /workspace are gone too; the next call starts a fresh sandbox.")
    )
    return (
        f"The sandbox did not respond: the kernel did not begin this cell within {timeout:g} s, so "
        f"it was replaced; all variables and imports are lost.{files}"
    )


async def _report(on_progress: ProgressCallback, elapsed: float, tail: str) -> None:
    try:
        await on_progress(elapsed, tail)
    except Exception:
        log.debug("progress notification failed", exc_info=True)


def list_session_records(state_dir: Path) -> list[dict[str, Any]]:
    """Records of live sessions of every bridge process using ``state_dir``, HTTP clients' named
    ``namespace/session``.

    Records whose owner process is gone (a bridge killed with SIGKILL) are left out.
    """
    records = []
    # HTTP clients' sessions live in their namespaces' directories (kernelbridge.server.namespaces);
    # the operator sees them as NAMESPACE/SESSION.
    paths = [("", path) for path in sorted((Path(state_dir) / "sessions").glob("*.session.json"))]
    http = sorted(Path(state_dir).glob(f"{HTTP_DIR}/*/sessions/*.session.json"))
    paths += [(path.parents[1].name, path) for path in http]
    for namespace, path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and namespace:
            record["name"] = f"{namespace}/{record.get('name')}"
            record["namespace"] = namespace
        if (
            isinstance(record, dict)
            and isinstance(pid := record.get("owner_pid"), int)
            and pid > 0
            and pid_alive(pid)
        ):
            records.append(record)
    return records
