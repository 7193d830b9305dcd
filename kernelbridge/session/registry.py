"""The session registry: the named sessions of one bridge (one namespace) and what they share.

``async with SessionRegistry(settings, runtime, image=..., agent_hash=...) as registry`` then
``await registry.run(name, code, timeout=30)``: a session is created on first use (its sandbox
from the warm pool when one is ready, or adopted when it outlived the bridge before), calls to one
session queue on its lock, different sessions run in parallel. The registry keeps the map and its
limit, grants, idle reaping, the warm pool and teardown; each :class:`~.session.Session` owns its
own life, and sessions that outlive the bridge are :class:`~.durability.Durability`'s business.
It knows nothing about MCP: :mod:`kernelbridge.server` renders the
:class:`~kernelbridge.session.cell.CellResult` it returns.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from kernelbridge.calls import NO_HUB, RpcHandler
from kernelbridge.calls.approval import Approver
from kernelbridge.config import Settings
from kernelbridge.errors import NO_SERVERS_CONFIGURED, KernelBridgeError, SessionError
from kernelbridge.host import Sandbox, WarmPool, close_sandbox
from kernelbridge.notebook.access import SandboxAccess
from kernelbridge.runtime import RuntimeBackend
from kernelbridge.session.adoption import restore_uri
from kernelbridge.session.cell import CellResult
from kernelbridge.session.durability import Durability, Lost, WarmSandbox, lost_result
from kernelbridge.session.outcome import FreshSandbox, Note, Queued, SandboxLost
from kernelbridge.session.recording import SessionJournal, journal_budget
from kernelbridge.session.records import SessionRecord
from kernelbridge.session.runner import SYSTEM_CLOCK, CellRunner, Clock, ProgressCallback
from kernelbridge.session.session import Origin, Services, Session
from kernelbridge.session.state import Change, Loss, SessionState
from kernelbridge.session.store import SessionStore, validate_session_name

log = logging.getLogger(__name__)

GrantCheck = Callable[[list[str]], list[str]]
"""Validates server names for ``servers=[...]`` (the hub); returns canonical names or raises."""

TEARDOWN_TIMEOUT = 25.0
"""Bound on stopping every sandbox at exit; they stop in parallel."""

__all__ = ["GrantCheck", "Session", "SessionRegistry", "validate_session_name"]


class SessionRegistry:
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
        self._dispatch = dispatch or NO_HUB
        self._check_grants = check_grants
        self._runner = CellRunner(max_timeout=settings.max_timeout, clock=clock)
        self._sessions: dict[str, Session] = {}
        self._pool: WarmPool[WarmSandbox] = WarmPool(
            settings.warm_pool, self._start_warm, settings.kernel_start_timeout
        )
        self._leaving = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._services: Services | None = None
        self._durability: Durability | None = None
        self.adopted_at_start = anyio.Event()
        """Set once the sessions a bridge before left are adopted (or found lost)."""
        self.lost: dict[str, SandboxLost] = {}
        """Sessions whose sandbox was found gone (at start), until their next call says so."""
        self._unsaid: dict[str, list[Note]] = {}
        """Notes of a session whose first sandbox did not start (e.g. that the one it outlived its
        bridge with was gone), for the session's next call."""

    # -- life ----------------------------------------------------------------------------------------
    async def __aenter__(self) -> SessionRegistry:
        self.store.open()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            self._tg = tg
            self._services = Services(
                self.settings,
                self.store,
                self._runner,
                self._dispatch,
                tg.start_soon,
                self._leaving,
                self.durable,
            )
            if self.durable:
                self._durability = Durability(
                    self.settings,
                    self.store,
                    self.runtime,
                    image=self.image,
                    agent_hash=self.agent_hash,
                    task_group=tg,
                )
                await self._durability.adopt_warm(self._pool)  # before the pool refills
            tg.start_soon(self._pool.run)
            tg.start_soon(self._reap_idle)
            tg.start_soon(self._adopt_at_start)
        except BaseException:
            # Leave the task group we entered, whatever failed half-way (unwrapped: the failure
            # is ours to raise, not the group's).
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg = self.task_group
        try:
            await self.aclose()
        finally:
            # Not given the caller's exception: anyio would wrap it in a group. A task of ours that
            # failed is raised from here (as a group), the caller's own exception as its context.
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    @property
    def durable(self) -> bool:
        """Whether this registry's sessions outlive it."""
        return self.settings.durable

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        assert self._tg is not None
        return self._tg

    def leave(self) -> None:
        """The bridge is going: a cancelled call leaves a durable sandbox's cell running."""
        self._leaving.set()

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until the sessions a bridge before left are adopted."""
        with anyio.move_on_after(timeout):
            await self.adopted_at_start.wait()

    async def aclose(self) -> None:
        """Let go of every sandbox and pooled sandbox (durable: they run on for the next bridge),
        or stop them; in parallel, shielded and bounded."""
        self.leave()
        sessions, self._sessions = list(self._sessions.values()), {}
        pool = self._pool.drain()
        if sessions or pool:
            what = "letting go of (they run on for the next bridge)" if self._durability else "closing"
            log.info("%s %d session(s) and %d warm sandbox(es)", what, len(sessions), len(pool))
        with anyio.CancelScope(shield=True), anyio.move_on_after(TEARDOWN_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(self._leave_session, session)
                for warm in pool:
                    tg.start_soon(self._leave_warm, warm)

    async def _leave_session(self, session: Session) -> None:
        if self._durability is not None and await self._durability.detach(session.sandbox, session.record):
            session.release_claim()
            return
        await session.close()

    async def _leave_warm(self, warm: WarmSandbox) -> None:
        if self._durability is not None:
            await self._durability.detach_warm(warm)
        else:
            await close_sandbox(warm.sandbox)

    async def _start_warm(self, name: str) -> WarmSandbox:
        """A sandbox started for ``name`` (a session, or ``warm-<id>`` for the pool), heard by nobody
        until a session takes it; a durable pooled one is kept for a later bridge too."""
        sandbox = Sandbox.create(
            self.settings,
            self.runtime,
            name,
            image=self.image,
            agent_hash=self.agent_hash,
            durable=self.durable,
        )
        await self.task_group.start(sandbox.run)
        warm = WarmSandbox(sandbox, Origin.WARM if name.startswith("warm-") else Origin.COLD)
        if self._durability is not None and warm.origin is Origin.WARM:
            self._durability.keep_warm(warm)
        return warm

    # -- queries -------------------------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """``list_sessions``: one entry per open session."""
        now = time.monotonic()
        return [session.listing(now) for session in self._sessions.values()]

    def detached(self) -> list[dict[str, Any]]:
        """``list_sessions``' other entries: this namespace's sessions whose sandbox runs without a
        bridge (``detached``), or that another bridge holds (``attached``, ``elsewhere``)."""
        return self._durability.listing(set(self._sessions)) if self._durability is not None else []

    @property
    def warm_kernels(self) -> int:
        """Started sandboxes waiting in the pool for a new session."""
        return len(self._pool)

    def journal_file(self, name: str) -> Path:
        """The journal of ``name``'s current generation. Raises SessionError if it has none."""
        return self.store.journal(validate_session_name(name))

    def session(self, name: str) -> Session | None:
        return self._sessions.get(name)

    # -- running code --------------------------------------------------------------------------------
    async def run(
        self,
        name: str,
        code: str,
        *,
        timeout: float,
        servers: list[str] | None = None,
        on_progress: ProgressCallback | None = None,
        approve: Approver | None = None,
        label: str | None = None,
        queue_wait: float | None = None,
        msg_id: str | None = None,
    ) -> CellResult:
        """Run ``code`` in session ``name`` (created on first use); calls to one session queue.
        ``servers`` are granted for the session's lifetime (host MCP servers its code may call);
        ``approve`` answers for the cell's calls that need a person's approval; ``label`` names a
        long job (an MCP task) to the calls that queue behind it. Behind such a job a call waits
        at most ``queue_wait`` seconds (SessionBusy past it; None: as long as it takes) and its
        result says it queued. Raises SessionError (bad name, too many sessions, unknown server),
        SandboxError/ImageError (no sandbox could start). A user's Python error is a normal result."""
        validate_session_name(name)
        granted = self._grants_for(servers or [])
        while True:
            if (lost := self.lost.pop(name, None)) is not None:  # also found while this call queued
                return lost_result(name, lost)
            session = self._session_for(name)
            ahead = session.running if session.lock.locked() else None
            queued: Queued | None = None
            if ahead is not None and ahead.label is not None:
                now, taken = time.monotonic(), False
                with anyio.move_on_after(queue_wait if queue_wait is not None else math.inf):
                    await session.lock.acquire()
                    taken = True
                if not taken:
                    raise SessionError(
                        f"session {name!r} is busy: queued behind {ahead.label}, started"
                        f" {now - ahead.started:.0f} s ago, for this call's {queue_wait:g} s; nothing ran"
                        " (wait for the task's result, cancel it, or use another session)"
                    )
                session.lock.release()  # taken again below, with the others' order kept
                queued = Queued(ahead.label, round(now - ahead.started, 1), round(time.monotonic() - now, 1))
            async with session.lock:
                if session.state is SessionState.CLOSED:
                    continue  # closed while we queued: the next loop creates a fresh one
                with session.taken() as first:
                    try:
                        await self._ensure_sandbox(session, first)
                    except Lost as exc:
                        return lost_result(name, exc.note)
                    began = self._runner.clock.now()  # waits from here on count against the timeout
                    await session.bind_grants(granted, timeout)
                    if queued is not None:
                        session.pending.insert(0, queued)
                    return await session.execute(
                        code, timeout, began=began, on_progress=on_progress, approve=approve, label=label,
                        msg_id=msg_id,
                    )  # fmt: skip

    async def follow(
        self, name: str, msg_id: str, *, timeout: float, label: str | None = None, since: float | None = None
    ) -> CellResult | None:
        """The result of cell ``msg_id`` of session ``name``, which the bridge before sent and
        left running (a task it ran): waited for as that call would have, the calls behind it
        queueing. None when this bridge did not inherit such a cell (it ended and was journalled
        before, or its sandbox was lost)."""
        validate_session_name(name)
        await self.adopted_at_start.wait()
        session = self._sessions.get(name)
        if session is None:
            return None
        async with session.lock:
            if session.state is SessionState.CLOSED or not session.alive:
                return None
            with session.taken():
                return await session.follow(msg_id, timeout, label=label, since=since)

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
                with session.taken() as first:
                    await self._ensure_sandbox(session, first)
                    assert session.sandbox is not None
                    return session.sandbox

    async def adopt_or_lost(self, name: str) -> SandboxLost | None:
        """Before a call: take over ``name``'s sandbox if it outlived its bridge (its first
        result then says so); the note saying it was lost instead, if it had cells (nothing has
        run: the caller may rebuild it with ``restore=``). None otherwise."""
        validate_session_name(name)
        session = self._sessions.get(name)
        if session is not None and session.state is SessionState.STARTING:
            async with session.lock:  # an adoption begun at start: wait for its verdict
                pass
        if (lost := self.lost.pop(name, None)) is not None or self._durability is None:
            return lost
        session = self._sessions.get(name)
        if session is not None and session.state is not SessionState.NEW:
            return None
        if self._durability.record_of(name) is None:
            return None
        try:
            await self.sandbox(name)
        except Lost as exc:
            return exc.note
        return None

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
            assert self._services is not None
            session = self._sessions[name] = Session(name, self._services)
            session.pending.extend(self._unsaid.pop(name, []))
        return session

    async def _ensure_sandbox(self, session: Session, first: bool) -> None:
        """Give the taken ``session`` a live sandbox: its first, or a fresh one after it lost one."""
        if not session.needs_sandbox():
            return
        if first:
            await self._first_sandbox(session)
        else:
            await self._fresh_sandbox(session)

    async def _first_sandbox(self, session: Session) -> None:
        """The session's first sandbox here: the one it outlived its bridge with (adopted), or
        one from the pool. Raises SessionError (another bridge holds the name), Lost."""
        try:
            budget = await journal_budget(self.settings)  # before the sandbox: nothing to undo
            if self._durability is not None:
                session.claim, record = await self._durability.hold(session.name)
                if record is not None and await self._adopted(session, record, budget):
                    return
            warm = await self._pool.take(session.name)
            session.take(warm.sandbox, warm.origin)
        except BaseException:
            if self._sessions.get(session.name) is session:
                del self._sessions[session.name]
                if session.pending:  # e.g. the adopted sandbox was gone: the next call says so
                    self._unsaid[session.name] = session.pending[:]
            session.change(Change.CLOSE)
            session.release_claim()
            raise
        session.change(Change.STARTED)
        secret = self._durability.secret_of(warm) if self._durability is not None else None
        session.journal, session.record = await SessionJournal.begin(
            self.store,
            session.name,
            budget,
            session.where(),
            quota=self.settings.disk_quota,
            later=session.pending,
            secret=secret,
            access=SandboxAccess.of(self.settings),
        )

    async def _adopted(self, session: Session, record: SessionRecord, budget: tuple[int, str]) -> bool:
        """Take over the sandbox ``record`` names for ``session``; False (saying why) when a fresh
        one must follow. Raises Lost (it had cells: nothing runs, ``restore=`` is offered)."""
        assert self._durability is not None
        outcome = await self._durability.adopt(session.name, record)
        if not isinstance(outcome, Sandbox):
            note = await self._durability.lose(record, outcome)
            if note.cells:
                raise Lost(note)
            session.pending.append(note)
            return False
        session.take(outcome, Origin.ADOPTED)
        session.change(Change.STARTED)
        session.grants = session.bound = frozenset(record.servers)
        session.journal, torn = await SessionJournal.resume(
            self.store, record, budget, quota=self.settings.disk_quota, later=session.pending
        )
        session.record = await self._durability.taken_over(record, outcome)
        session.inherit(outcome.adoption, torn)
        outcome.resume()  # the session hears it now: what it held back may come
        log.info("adopted the sandbox of session %s (%s)", session.name, record.container)
        return True

    async def _fresh_sandbox(self, session: Session) -> None:
        loss, session.loss = session.loss, None
        old = session.drop_sandbox()
        if old is not None:
            await close_sandbox(old)
        try:
            warm = await self._pool.take(session.name)
        except BaseException:
            session.change(Change.LOSE, Loss("no sandbox could be started"))
            raise
        session.take(warm.sandbox, warm.origin)
        session.change(Change.STARTED)
        if self._durability is not None:
            self._durability.secret_of(warm)
            if session.record is not None:
                session.record = self._durability.rekey(session.record, warm.sandbox)
        session.write_record()
        session.pending.append(fresh_sandbox_note(session, loss))

    async def _adopt_at_start(self) -> None:
        """In the background at start: adopt every session of this namespace whose sandbox
        outlived its bridge (in parallel, at most the session limit), so that its first call finds
        it attached; a sandbox found lost is said by the session's next call."""
        try:
            if self._durability is not None:
                records = await self._durability.adoptable()
                async with anyio.create_task_group() as tg:
                    for record in records:
                        tg.start_soon(self._adopt_early, record.session)
        finally:
            self.adopted_at_start.set()

    async def _adopt_early(self, name: str) -> None:
        try:
            await self.sandbox(name)
        except Lost as exc:
            self.lost[name] = exc.note
        except KernelBridgeError as exc:  # held by another bridge meanwhile, the engine is down
            log.info("session %s was not adopted at start: %s", name, exc)

    # -- closing -------------------------------------------------------------------------------------
    async def close(self, name: str) -> bool:
        """Close session ``name`` (stopping its sandbox, even mid-cell; a detached one's too);
        False if it is not open. Raises SessionError when another bridge holds it."""
        session = self._sessions.pop(validate_session_name(name), None)
        self._unsaid.pop(name, None)
        if session is None:
            self.lost.pop(name, None)
            return self._durability is not None and await self._durability.end_detached(name)
        await session.close()
        return True

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
                    await session.close()


def fresh_sandbox_note(session: Session, loss: Loss | None) -> FreshSandbox:
    """What the call that replaced ``session``'s sandbox says: how the old one ended and, when it
    died with cells in the journal, the ``restore=`` that re-runs them."""
    died = loss.died if loss is not None else None
    cells = session.journal.cells if session.journal is not None else 0
    if died is None or not cells or session.record is None:
        return FreshSandbox(died)
    return FreshSandbox(died, cells, restore_uri(session.record))
