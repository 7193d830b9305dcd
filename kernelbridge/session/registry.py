"""The session registry: named, stateful sandboxes of one bridge, with ordered calls and a warm pool.

It owns the map of sessions and its limits: create on first use (from the warm pool when one is
ready), one call at a time per session (an ``anyio.Lock``; different sessions run in parallel),
host MCP grants per session, idle reaping, closing and teardown. Each session's life is one state
machine (:mod:`kernelbridge.session.state`); a call's cell runs under the timeout policy of the
:class:`~kernelbridge.session.runner.CellRunner`; what a session writes down goes to the
:class:`~kernelbridge.session.store.SessionStore` (its generation's record and journal,
:mod:`kernelbridge.session.recording`). It knows nothing about MCP: :mod:`kernelbridge.server`
calls :meth:`SessionRegistry.run` and renders the :class:`~kernelbridge.session.cell.CellResult`,
whose notes are values (:mod:`kernelbridge.session.outcome`).

Sessions outlive their bridge (``settings.durable``): the registry's
:class:`~kernelbridge.session.adopter.Adopter` holds each name (a name another live bridge holds is
refused), lets go of the sandboxes at ``aclose`` instead of stopping them, and adopts the ones a
bridge before left, at start in the background (a session's first call waits for its own), the
warm pool's before the pool refills.

Each sandbox sits in a :class:`~kernelbridge.session.seat.Seat` with its handlers: its iopub goes
to the session's :class:`~kernelbridge.session.recorder.Recorder` (cells sent by any Jupyter
client, e.g. ``kernelbridge attach``, are journalled too), its rpc to the session's
:class:`~kernelbridge.session.broker.RpcBroker`. Sandboxes come from an injected
:class:`~kernelbridge.runtime.RuntimeBackend` (a container engine, or the local test double).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from kernelbridge.config import Settings
from kernelbridge.errors import NO_SERVERS_CONFIGURED, SessionError
from kernelbridge.host import Death, Sandbox, WarmPool, close_sandbox
from kernelbridge.hub.approval import Approver
from kernelbridge.hub.rpc import RpcHandler
from kernelbridge.runtime import RuntimeBackend
from kernelbridge.session.adopter import Adopter, Lost, lost_result
from kernelbridge.session.broker import RpcBroker, approving
from kernelbridge.session.cell import Cell, CellResult, finish_cell
from kernelbridge.session.closing import Closing, where
from kernelbridge.session.named import Session
from kernelbridge.session.outcome import FreshSandbox, ProxiesNotRefreshed, SandboxLost, Status
from kernelbridge.session.recorder import Recorder
from kernelbridge.session.recording import SessionJournal, journal_budget, on_display
from kernelbridge.session.runner import SYSTEM_CLOCK, CellRunner, Clock, ProgressCallback, Run
from kernelbridge.session.seat import NO_HUB, Seat, SeatTarget
from kernelbridge.session.state import Change, Loss, SessionState
from kernelbridge.session.store import SessionStore, validate_session_name

log = logging.getLogger(__name__)

GrantCheck = Callable[[list[str]], list[str]]
"""Validates server names for ``servers=[...]`` (the hub); returns canonical names or raises."""

TEARDOWN_TIMEOUT = 25.0
"""Bound on stopping every sandbox at exit; they stop in parallel."""
REFRESH_TIMEOUT = 30.0
"""Bound on rebinding the host-MCP proxies in the kernel after a grant or a restart (the call's
own timeout when less: a wedged sandbox must not add this to it)."""

__all__ = ["GrantCheck", "Session", "SessionRegistry", "validate_session_name"]


class SessionRegistry(Closing):
    """All sessions of one bridge (one namespace). Use as ``async with SessionRegistry(...) as r``."""

    def __init__(
        self,
        settings: Settings,
        runtime: RuntimeBackend,
        *,
        image: str,
        agent_hash: str | None,
        dispatch: RpcHandler | None = None,
        check_grants: GrantCheck | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.runtime = runtime
        self.image = image
        self.agent_hash = agent_hash
        self.store = SessionStore.of(settings)
        self._dispatch = dispatch
        self._check_grants = check_grants
        self._runner = CellRunner(max_timeout=settings.max_timeout, clock=clock)
        self._sessions: dict[str, Session] = {}
        self._pool: WarmPool[Seat] = WarmPool(
            settings.warm_pool, self._start_sandbox, settings.kernel_start_timeout
        )
        self._tg: anyio.abc.TaskGroup | None = None
        self._adopter = Adopter(self) if settings.durable else None
        self._leaving = False
        self.lost: dict[str, SandboxLost] = {}
        """Sessions whose sandbox was found gone (at start), until their next call says so."""

    async def __aenter__(self) -> SessionRegistry:
        self.store.open()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self._adopter is not None:
            await self._adopter.open(self._tg, self._pool)  # the warm pool's before it refills
        self._tg.start_soon(self._pool.run)
        self._tg.start_soon(self._reap_idle)
        if self._adopter is not None:
            self._tg.start_soon(self._adopter.adopt_all)
        return self

    def leave(self) -> None:
        """The bridge is going: a cancelled call leaves a durable sandbox's cell running."""
        self._leaving = True

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until the sessions a bridge before left are adopted."""
        if self._adopter is not None:
            with anyio.move_on_after(timeout):
                await self._adopter.adopted_at_start.wait()

    @property
    def durable(self) -> bool:
        """Whether this registry's sessions outlive it."""
        return self._adopter is not None

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        assert self._tg is not None
        return self._tg

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    async def aclose(self) -> None:
        """Let go of every sandbox and pooled sandbox (durable: they run on for the next bridge),
        or stop them; in parallel, shielded and bounded."""
        self.leave()
        sessions, self._sessions = list(self._sessions.values()), {}
        pool = self._pool.drain()
        adopter = self._adopter
        if sessions or pool:
            what = "closing" if adopter is None else "letting go of (they run on for the next bridge)"
            log.info("%s %d session(s) and %d warm sandbox(es)", what, len(sessions), len(pool))
        with anyio.CancelScope(shield=True), anyio.move_on_after(TEARDOWN_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(self.close_session if adopter is None else adopter.detach, session)
                for seat in pool:
                    if adopter is None:
                        tg.start_soon(close_sandbox, seat.sandbox)
                    else:
                        tg.start_soon(adopter.detach_warm, seat)

    async def _start_sandbox(self, name: str) -> Seat:
        assert self._tg is not None
        sandbox = Sandbox.create(
            self.settings,
            self.runtime,
            name,
            image=self.image,
            agent_hash=self.agent_hash,
            durable=self.durable,
        )
        seat = Seat(sandbox)
        await self._tg.start(partial(sandbox.run, seat.handlers()))
        if self._adopter is not None and name.startswith("warm-"):
            self._adopter.keep_warm(seat)
        return seat

    # -- queries -------------------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """``list_sessions``: one entry per open session."""
        now = time.monotonic()
        busy = (SessionState.STARTING, SessionState.BUSY)
        return [
            {
                "session": s.name,
                "state": s.state.listed,
                "cells": s.journal.cells if s.journal is not None else 0,
                "idle_seconds": 0 if s.state in busy else round(now - s.last_used),
                "container": s.sandbox.container_name if s.sandbox is not None else None,
                "servers": sorted(s.grants),
            }
            for s in self._sessions.values()
        ]

    def detached(self) -> list[dict[str, Any]]:
        """``list_sessions``' other entries: this namespace's sessions whose sandbox runs without a
        bridge (``detached``: the next use adopts it), or that another bridge holds (``elsewhere``)."""
        return self._adopter.listing(set(self._sessions)) if self._adopter is not None else []

    @property
    def warm_kernels(self) -> int:
        """Started sandboxes waiting in the pool for a new session."""
        return len(self._pool)

    def journal_file(self, name: str) -> Path:
        """The journal of ``name``'s current generation. Raises SessionError if it has none."""
        return self.store.journal(validate_session_name(name))

    def session(self, name: str) -> Session | None:
        return self._sessions.get(name)

    # -- running code --------------------------------------------------------------------------
    async def run(
        self,
        name: str,
        code: str,
        *,
        timeout: float,
        servers: list[str] | None = None,
        on_progress: ProgressCallback | None = None,
        approve: Approver | None = None,
    ) -> CellResult:
        """Run ``code`` in session ``name`` (created on first use); calls to one session queue.
        ``servers`` are granted for the session's lifetime (host MCP servers its code may call);
        ``approve`` answers for the cell's calls that need a person's approval. Raises SessionError
        (bad name, too many sessions, unknown server), SandboxError/ImageError (no sandbox could
        start). A user's Python error is a normal result."""
        validate_session_name(name)
        granted = self._grants_for(servers or [])
        while True:
            if (lost := self.lost.pop(name, None)) is not None:  # also found while this call queued
                return lost_result(name, lost)
            session = self._session_for(name)
            async with session.lock:
                if session.state is SessionState.CLOSED:
                    continue  # closed while we queued: the next loop creates a fresh one
                with self._taken(session) as first:
                    try:
                        seat = await self._ensure_sandbox(session, first)
                    except Lost as exc:
                        return lost_result(name, exc.note)
                    began = self._runner.clock.now()  # waits from here on count against the timeout
                    if granted - session.grants:
                        session.grants |= granted
                        self._write_record(session)
                    if session.grants != session.bound:
                        grants = session.grants
                        refreshed = await seat.refresh_proxies(session.name, min(REFRESH_TIMEOUT, timeout))
                        if refreshed:
                            session.bound = grants
                        elif refreshed is not None:
                            session.pending.append(ProxiesNotRefreshed())
                    return await self._execute(session, seat, code, timeout, on_progress, began, approve)

    async def adopt_or_lost(self, name: str) -> SandboxLost | None:
        """Before a call: take over ``name``'s sandbox if it outlived its bridge (its first
        result then says so); the note saying it was lost instead, if it had cells (nothing has
        run: the caller may rebuild it with ``restore=``). None otherwise."""
        validate_session_name(name)
        session = self._sessions.get(name)
        if session is not None and session.state is SessionState.STARTING:
            async with session.lock:  # an adoption begun at start: wait for its verdict
                pass
        if (lost := self.lost.pop(name, None)) is not None or self._adopter is None:
            return lost
        session = self._sessions.get(name)
        if (session is not None and session.state is not SessionState.NEW) or not self._adopter.record_of(
            name
        ):
            return None
        try:
            await self.sandbox(name)
        except Lost as exc:
            return exc.note
        return None

    async def sandbox(self, name: str) -> Sandbox:
        """The live sandbox of session ``name`` (created on first use, replaced if it died), e.g.
        to place files before a call. Raises as :meth:`run` does (and Lost: the sandbox it
        outlived its bridge with is gone, with its cells)."""
        validate_session_name(name)
        while True:
            if (lost := self.lost.pop(name, None)) is not None:
                raise Lost(lost)
            session = self._session_for(name)
            async with session.lock:
                if session.state is SessionState.CLOSED:
                    continue
                with self._taken(session) as first:
                    return (await self._ensure_sandbox(session, first)).sandbox

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

    @contextlib.contextmanager
    def _taken(self, session: Session) -> Iterator[bool]:
        """Hold ``session`` for one call (its lock is held): TAKE, then RELEASE whatever happens.
        Yields whether this is its first call (it never had a sandbox)."""
        first = session.change(Change.TAKE) is SessionState.NEW
        try:
            yield first
        finally:
            sandbox = session.sandbox
            if session.state is SessionState.BUSY and (sandbox is None or not sandbox.alive):
                session.change(Change.LOSE, _died(sandbox.death if sandbox else None))
            session.change(Change.RELEASE)
            session.last_used = time.monotonic()

    async def _ensure_sandbox(self, session: Session, first: bool) -> Seat:
        """Give the taken ``session`` a live sandbox: its first, or a fresh one after it lost one."""
        if session.state is SessionState.BUSY:
            seat = session.seat
            if seat is not None and seat.sandbox.alive:
                return seat
            session.change(Change.LOSE, _died(seat.sandbox.death if seat else None))
            session.change(Change.TAKE)  # DEAD -> STARTING: a fresh one, below
        if first:
            return await self._first_sandbox(session)
        return await self._fresh_sandbox(session)

    async def _first_sandbox(self, session: Session) -> Seat:
        """The session's first sandbox here: the one it outlived its bridge with (adopted), or
        one from the pool. Raises SessionError (another bridge holds the name), Lost."""
        try:
            budget = await journal_budget(self.settings)  # before the sandbox: nothing to undo
            if self._adopter is not None and (record := await self._adopter.hold(session)) is not None:
                if (adopted := await self._adopter.adopt(session, record, budget)) is not None:
                    return adopted
            seat = await self._pool.take(session.name)
            self.attach(session, seat)
        except BaseException:
            if self._sessions.get(session.name) is session:
                del self._sessions[session.name]
            session.change(Change.CLOSE)
            session.release_claim()
            raise
        session.change(Change.STARTED)
        session.journal, session.record = await SessionJournal.begin(
            self.store,
            session.name,
            budget,
            where(seat.sandbox),
            quota=self.settings.disk_quota,
            later=session.pending,
            secret=self._adopter.secret_for(seat) if self._adopter is not None else None,
        )
        return seat

    async def _fresh_sandbox(self, session: Session) -> Seat:
        loss, session.loss = session.loss, None
        old, session.seat = session.seat, None
        if old is not None:
            if old.broker is not None:
                # The old kernel's calls would hold this session's slots in the hub until they end.
                old.broker.cancel()
            await close_sandbox(old.sandbox)
        try:
            seat = await self._pool.take(session.name)
            self.attach(session, seat)
        except BaseException:
            session.seat = old  # keep something to report and to close later
            session.change(Change.LOSE, Loss("no sandbox could be started"))
            raise
        session.change(Change.STARTED)
        if self._adopter is not None:
            self._adopter.rekey(session, seat)
        self._write_record(session)
        session.pending.append(FreshSandbox(loss.died if loss is not None else None))
        return seat

    def attach(self, session: Session, seat: Seat) -> None:
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

        async def client_cell(cell: Cell) -> None:
            if session.journal is not None:
                await session.journal.append_client(cell, *broker.take_cell(cell.msg_id))

        recorder = Recorder(
            self.settings.output_limit,
            on_client_cell=client_cell,
            client_execute=sandbox.client_execute,
            on_running=running,
            on_display=lambda event, shown: on_display(session.journal, event, shown),  # earlier cells'
            clock=self._runner.clock.now,
        )
        seat.recorder, seat.broker = recorder, broker
        seat.on_end = partial(self._seat_ended, session)
        session.seat = seat
        session.bound = frozenset()

    def _seat_ended(self, session: Session, seat: Seat) -> None:
        """A sandbox of ``session`` ended: if it died while the session was idle, say so now
        (``list_sessions``); a call in progress finds out by itself."""
        if session.seat is seat and session.state is SessionState.IDLE:
            session.change(Change.LOSE, _died(seat.sandbox.death))

    async def _execute(
        self,
        session: Session,
        seat: Seat,
        code: str,
        timeout: float,
        on_progress: ProgressCallback | None,
        began: float,
        approve: Approver | None = None,
    ) -> CellResult:
        recorder = seat.recorder
        assert recorder is not None
        notes, session.pending = session.pending, []
        if (background := recorder.take_background()) is not None:
            notes.append(background)
        cell = recorder.expect(uuid.uuid4().hex, code)

        async def finish(run: Run) -> CellResult:
            if self._leaving and run.status is Status.CANCELLED and self._adopter is not None:
                # Left running for the next bridge, which journals it as it ends.
                return finish_cell(cell, session=session.name, status=run.status, state=run.state)
            if self._adopter is not None:
                notes[:0] = await self._adopter.inherited(session, recorder)
            result = finish_cell(
                cell, session=session.name, status=run.status, state=run.state, notes=notes + run.notes
            )
            if seat.broker is not None:
                result.tool_calls, result.packages = seat.broker.take_cell(cell.msg_id)
            result.waited_ms = cell.waited_ms() if cell.started is not None else 0
            if session.journal is not None:
                result.notes += await session.journal.append_result(
                    code, result, sorted(session.grants), timeout
                )
            return result

        target = SeatTarget(
            seat,
            closed=lambda: session.state is SessionState.CLOSED,
            discard=partial(self._discard, session, seat),
            restarted=partial(self._restarted, session),
            leaving=lambda: self._leaving and self._adopter is not None,
        )
        try:
            with approving(seat.broker, cell.msg_id, approve):  # its calls ask this call's client
                run = await self._runner.run(
                    target, cell, code, timeout, began=began, on_progress=on_progress, on_cancel=finish
                )
        finally:
            recorder.forget(cell)
        return await finish(run)

    def _restarted(self, session: Session) -> None:
        """The session's kernel was restarted in place: its proxies are gone."""
        session.bound = frozenset()
        self._write_record(session)

    def _discard(self, session: Session, seat: Seat) -> None:
        """Drop the session's sandbox now; it is closed in the background (bounded)."""
        if session.seat is seat:
            session.seat = None
            session.bound = frozenset()
            if session.state is not SessionState.CLOSED:
                session.change(Change.LOSE, Loss.discarded())
        if seat.broker is not None:  # its calls answer a kernel that is gone: end them now
            seat.broker.cancel()
        if self._tg is not None:
            self._tg.start_soon(close_sandbox, seat.sandbox)


def _died(death: Death | None) -> Loss:
    return Loss(death.reason if death is not None else "the sandbox ended while idle")
