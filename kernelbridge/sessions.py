"""The session registry: named, stateful kernels with ordered calls, timeouts and a warm pool.

It owns the lifecycle of every kernel the bridge starts: create on first use (from the warm pool
when one is ready), one call at a time per session (an ``anyio.Lock``; different sessions run in
parallel), the timeout policy (interrupt, then restart if the interrupt does not land), death
detection, idle reaping, and teardown. It knows nothing about MCP: :mod:`kernelbridge.server`
calls :meth:`SessionRegistry.run` and renders the :class:`~kernelbridge.execution.CellResult`.

Kernels come from an injected :data:`KernelFactory`, so tests can use plain local kernels and
the product uses sandboxed ones (:func:`sandbox_kernel_factory`).

While a session is live its record ``<state_dir>/sessions/<name>.session.json`` tells other
processes (``kernelbridge sessions``, ``attach``) where its connection file is.

Shutdown escalation (timeouts and cancellation): a cell that overran is first interrupted
(message-mode interrupt on the control channel: a KeyboardInterrupt in the cell). Most code stops
within :data:`INTERRUPT_GRACE`, and then the session keeps its variables. Code that swallows
KeyboardInterrupt, or is stuck in C, does not; the only honest way to free the session is to
restart the kernel, and the result says ``state: lost``. Restart failing too (the sandbox is
wedged) means replacing the kernel through the factory. Every step is bounded by a named constant.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from jupyter_client.manager import AsyncKernelManager

from kernelbridge.config import Settings
from kernelbridge.errors import SessionError
from kernelbridge.execution import CellResult, CellRun, State, Status, finish_cell, start_cell
from kernelbridge.kernel.manager import wait_for_iopub
from kernelbridge.notebook import Journal, journal_path
from kernelbridge.runtime import pid_alive
from kernelbridge.warm_pool import SHUTDOWN_TIMEOUT, KernelFactory, KernelHandle, WarmPool, stop_kernel

log = logging.getLogger(__name__)

ProgressCallback = Callable[[float, str], Awaitable[None]]
"""Called with (seconds elapsed, latest output lines) while a cell runs."""

SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Session names end up in container names and file paths: no slashes, no leading dot."""
INTERRUPT_GRACE = 3.0
"""Seconds an interrupted cell gets to finish before the kernel is restarted."""
TEARDOWN_TIMEOUT = 25.0
"""Bound on stopping every kernel at exit; they stop in parallel."""
TICK = 1.0
"""How often a running cell is checked for kernel death (an OOM kill leaves no idle message)."""
PROGRESS_EVERY = 2.0
"""Seconds between progress notifications of a long cell."""


def validate_session_name(name: object) -> str:
    """Return ``name`` if it is a valid session name; raise SessionError saying why not."""
    if not isinstance(name, str) or not SESSION_NAME.match(name):
        raise SessionError(
            f"invalid session name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )
    return name


def sandbox_kernel_factory(settings: Settings) -> KernelFactory:
    """Kernels in sandbox containers (the product's factory)."""

    async def start(name: str) -> KernelHandle:
        from kernelbridge.kernel import SandboxKernelManager, connect_client

        km = SandboxKernelManager(settings=settings, session_name=name)
        await km.start_kernel()
        try:
            kc = await connect_client(km)
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT):
                await km.shutdown_kernel(now=True)
            raise
        return km, kc

    return start


@dataclass(eq=False)
class Session:
    name: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    handle: KernelHandle | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    journal: Journal | None = None
    dead: str | None = None
    """Why the kernel died, until the next call starts a fresh one."""
    closed: bool = False
    busy: bool = False
    notes: list[str] = field(default_factory=list)
    """Sentences for the next result (e.g. that the kernel was replaced)."""

    def __repr__(self) -> str:
        state = "closed" if self.closed else "dead" if self.dead else "busy" if self.busy else "idle"
        return f"<Session {self.name!r} {state}>"


class SessionRegistry:
    """All sessions of one bridge. Use as ``async with SessionRegistry(...) as registry``."""

    def __init__(self, settings: Settings, kernel_factory: KernelFactory) -> None:
        self.settings = settings
        self._factory = kernel_factory
        self._sessions: dict[str, Session] = {}
        self._pool = WarmPool(settings.warm_pool, kernel_factory, settings.kernel_start_timeout)
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> SessionRegistry:
        self.settings.sessions_dir.mkdir(parents=True, exist_ok=True)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._pool.run)
        self._tg.start_soon(self._reap_idle)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every kernel and pooled kernel, in parallel, shielded and bounded."""
        sessions, self._sessions = list(self._sessions.values()), {}
        pool = self._pool.drain()
        with anyio.CancelScope(shield=True), anyio.move_on_after(TEARDOWN_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(self._close_session, session)
                for handle in pool:
                    tg.start_soon(stop_kernel, handle)

    # -- queries -----------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "session": s.name,
                "state": "dead" if s.dead else "busy" if s.busy else "idle" if s.handle else "starting",
                "cells": s.journal.cells if s.journal else 0,
                "idle_seconds": 0 if s.busy else round(now - s.last_used),
                "container": _container_of(s),
            }
            for s in self._sessions.values()
        ]

    @property
    def warm_kernels(self) -> int:
        """Started kernels waiting in the pool for a new session."""
        return len(self._pool)

    def journal_file(self, name: str) -> Path:
        return journal_path(self.settings.sessions_dir, validate_session_name(name))

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

        Raises SessionError (bad name, too many sessions) and SandboxError/ImageError when a
        kernel cannot be started. A user's Python error is a normal result.
        """
        validate_session_name(name)
        while True:
            session = self._session_for(name)
            async with session.lock:
                if session.closed:
                    continue  # closed while we queued: the next loop creates a fresh one
                session.busy = True
                try:
                    await self._ensure_kernel(session)
                    return await self._execute(session, code, timeout, servers or [], on_progress)
                finally:
                    session.busy = False
                    session.last_used = time.monotonic()

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

    async def _ensure_kernel(self, session: Session) -> None:
        """Give ``session`` a live kernel: first use, or after its kernel died."""
        if session.handle is not None and session.dead is None and not await session.handle[0].is_alive():
            session.dead = _death_reason(session.handle[0]) or "the kernel exited while idle"
        if session.handle is not None and session.dead is None:
            return
        if session.handle is not None:
            reason, session.dead = session.dead, None
            await self._replace_kernel(session)
            session.notes.append(
                f"The previous kernel died ({reason}); this call started a fresh kernel: "
                "earlier variables and imports are gone."
            )
            return
        try:
            session.handle = await self._take_kernel(session.name)
        except BaseException:
            if self._sessions.get(session.name) is session:
                del self._sessions[session.name]
            session.closed = True
            raise
        session.journal = Journal(self.journal_file(session.name), session.name)
        await anyio.to_thread.run_sync(session.journal.start)
        self._write_record(session)

    async def _take_kernel(self, name: str) -> KernelHandle:
        return await self._pool.take(name)

    async def _execute(
        self,
        session: Session,
        code: str,
        timeout: float,
        servers: list[str],
        on_progress: ProgressCallback | None,
    ) -> CellResult:
        assert session.handle is not None
        km, kc = session.handle
        notes, session.notes = session.notes, []
        run = start_cell(kc, code, self.settings.output_limit)
        deadline = run.started + timeout
        status: Status = "ok"
        state: State = "kept"
        last_progress = run.started
        try:
            while not await run.wait(min(deadline, time.monotonic() + TICK)):
                now = time.monotonic()
                if session.closed:
                    status, state = "kernel_died", "lost"
                    notes.append("The session was closed while this cell ran.")
                    break
                if run.broken or not await km.is_alive():
                    session.dead = _death_reason(km) or "the kernel process exited"
                    status, state = "kernel_died", "lost"
                    notes.append(
                        f"The kernel died: {session.dead}. Its state is lost; "
                        "the next call on this session starts a fresh kernel."
                    )
                    break
                if now >= deadline:
                    status = "timeout"
                    container = _container_of(session)
                    state = await self._stop_overrun(session, run)
                    same_sandbox = container is not None and _container_of(session) == container
                    notes.append(_timeout_note(timeout, state, files_kept=same_sandbox))
                    break
                if on_progress is not None and now - last_progress >= PROGRESS_EVERY:
                    last_progress = now
                    await _report(on_progress, now - run.started, run.outputs.progress_tail())
        except BaseException:
            # Cancelled (the client gave up) or crashed: never leave the cell running behind the
            # lock, or the next call would silently queue behind it.
            with anyio.CancelScope(shield=True):
                if not run.done and not session.closed:
                    state = await self._stop_overrun(session, run)
                    result = finish_cell(
                        run, session=session.name, status="cancelled", state=state, notes=notes
                    )
                    await self._journal(session, code, result, servers)
            raise
        result = finish_cell(run, session=session.name, status=status, state=state, notes=notes)
        await self._journal(session, code, result, servers)
        return result

    async def _stop_overrun(self, session: Session, run: CellRun) -> State:
        """Interrupt a cell that overran; restart the kernel if that does not stop it."""
        assert session.handle is not None
        km, _ = session.handle
        try:
            with anyio.fail_after(INTERRUPT_GRACE):
                await km.interrupt_kernel()
        except (Exception, TimeoutError):
            log.warning("interrupting session %s failed", session.name, exc_info=True)
        if await run.wait(time.monotonic() + INTERRUPT_GRACE):
            return "kept"
        await self._restart(session)
        return "lost"

    async def _restart(self, session: Session) -> None:
        assert session.handle is not None
        km, kc = session.handle
        try:
            with anyio.fail_after(self.settings.kernel_start_timeout):
                await km.restart_kernel(now=True)
                # The client's sockets reconnect to the new kernel: its SUB is a slow joiner
                # again, so prove iopub (not just shell) before the next cell's outputs flow.
                await wait_for_iopub(kc, self.settings.kernel_start_timeout, km)
            self._write_record(session)
        except Exception:
            log.warning("restarting session %s failed; replacing its kernel", session.name, exc_info=True)
            await self._replace_kernel(session)

    async def _replace_kernel(self, session: Session) -> None:
        old, session.handle = session.handle, None
        if old is not None:
            await stop_kernel(old)
        try:
            session.handle = await self._take_kernel(session.name)
        except BaseException:
            session.handle = old  # keep something to report and to stop later
            session.dead = "no kernel could be started"
            raise
        self._write_record(session)

    async def _journal(self, session: Session, code: str, result: CellResult, servers: list[str]) -> None:
        if session.journal is None:
            return
        try:
            await anyio.to_thread.run_sync(session.journal.append, code, result, servers)
        except OSError:
            log.exception("writing the journal of session %s failed", session.name)

    # -- closing -----------------------------------------------------------------------------

    async def close(self, name: str) -> bool:
        """Close session ``name`` (stopping its kernel, even mid-cell); False if it is not open."""
        session = self._sessions.pop(validate_session_name(name), None)
        if session is None:
            return False
        await self._close_session(session)
        return True

    async def _close_session(self, session: Session) -> None:
        session.closed = True
        handle, session.handle = session.handle, None
        if handle is not None:
            await stop_kernel(handle)
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
        if session.handle is None:
            return
        km, _ = session.handle
        record = {
            "name": session.name,
            "connection_file": str(km.connection_file),
            "container": _container_of(session),
            "kernel_id": km.kernel_id,
            "owner_pid": os.getpid(),
            "created": session.created,
        }
        path = self._record_path(session)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)

    def _remove_record(self, session: Session) -> None:
        path = self._record_path(session)
        try:
            if json.loads(path.read_text()).get("owner_pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass


def _death_reason(km: AsyncKernelManager) -> str | None:
    reason = getattr(km, "death_reason", None)
    return reason() if callable(reason) else None


def _container_of(session: Session) -> str | None:
    return getattr(session.handle[0], "container_name", None) if session.handle else None


def _timeout_note(timeout: float, state: State, files_kept: bool = False) -> str:
    if state == "kept":
        return f"Timed out after {timeout:g} s and was interrupted; the session's variables are kept."
    files = " Files in /workspace are kept (same sandbox)." if files_kept else ""
    return (
        f"Timed out after {timeout:g} s and ignored the interrupt, so the kernel was restarted: "
        f"all variables and imports are lost.{files}"
    )


async def _report(on_progress: ProgressCallback, elapsed: float, tail: str) -> None:
    try:
        await on_progress(elapsed, tail)
    except Exception:
        log.debug("progress notification failed", exc_info=True)


def list_session_records(state_dir: Path) -> list[dict[str, Any]]:
    """Records of live sessions of every bridge process using ``state_dir``.

    Records whose owner process is gone (a bridge killed with SIGKILL) are left out.
    """
    records = []
    for path in sorted((Path(state_dir) / "sessions").glob("*.session.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(record, dict)
            and isinstance(pid := record.get("owner_pid"), int)
            and pid > 0
            and pid_alive(pid)
        ):
            records.append(record)
    return records
