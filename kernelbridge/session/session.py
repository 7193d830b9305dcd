"""One named session: the one owner of its life.

A :class:`Session` holds its lock (one call at a time), its state (changed only through the
table of :mod:`.state`), its sandbox with the recorder and rpc broker that hear it, its journal
and record, its claim on the name, and which container is its own (:meth:`Session.take` is the
one place a sandbox becomes a session's, cold, warm or adopted). It is what the cell runner
drives (:class:`~.runner.CellTarget`) and what its sandbox talks to (its handlers).

The registry keeps the map, limits, grants, idle reaping, the warm pool and teardown; what a
session needs of the bridge comes in one :class:`Services` value, never a reference back.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio

from kernelbridge import frames
from kernelbridge.calls import RpcHandler
from kernelbridge.calls.approval import Approver
from kernelbridge.config import Settings
from kernelbridge.errors import NoHostServers, SandboxError
from kernelbridge.host import NO_HANDLERS, Death, Sandbox, SandboxHandlers, close_sandbox
from kernelbridge.session.adoption import CATCH_UP_WAIT, adopted_note, catch_up
from kernelbridge.session.broker import RpcBroker, Spawn, approving
from kernelbridge.session.cell import Cell, CellResult, finish_cell
from kernelbridge.session.outcome import Note, ProxiesNotRefreshed, State, Status
from kernelbridge.session.ownership import Claim
from kernelbridge.session.recorder import Recorder
from kernelbridge.session.recording import SessionJournal, on_display
from kernelbridge.session.records import SessionRecord
from kernelbridge.session.runner import INTERRUPT_GRACE, CellRunner, ProgressCallback, Run
from kernelbridge.session.state import Change, Loss, SessionState, next_state
from kernelbridge.session.store import SessionStore
from kernelbridge.tunnel import Adoption, InheritedCell, RpcRequest

log = logging.getLogger(__name__)

REFRESH_CODE = "__import__('mcp')._kernelbridge_refresh()"
"""Sent as a silent request: rebinds ``mcp_<alias>`` proxies for the session's grants."""
REFRESH_TIMEOUT = 30.0
"""Bound on rebinding the host-MCP proxies in the kernel after a grant or a restart (the call's
own timeout when less: a wedged sandbox must not add this to it)."""


class Origin(enum.Enum):
    """Where a session's sandbox came from (its record names the container either way)."""

    COLD = "cold"
    """Started for this session."""
    WARM = "warm"
    """Taken from the warm pool (its container's label names the pool, not the session)."""
    ADOPTED = "adopted"
    """It outlived the bridge before this one, which adopted it."""


@dataclass(frozen=True, slots=True)
class Services:
    """What a session needs of its bridge, given once by the registry."""

    settings: Settings
    store: SessionStore
    runner: CellRunner
    dispatch: RpcHandler
    spawn: Spawn
    leaving: anyio.Event
    """Set when the bridge is going and its durable sandboxes run on without it."""
    durable: bool


class Session:
    """One named session of a registry (see the module docstring)."""

    def __init__(self, name: str, services: Services) -> None:
        self.name = name
        self._services = services
        self.lock = anyio.Lock()
        """Held by the call that has taken the session."""
        self.running: Running | None = None
        """The cell the bridge runs now (``list_sessions`` says how long and its latest line)."""
        self._state = SessionState.NEW
        self.loss: Loss | None = None
        """Why it lost its sandbox (DEAD), until the next call says so."""
        self.sandbox: Sandbox | None = None
        self.origin: Origin | None = None
        self.recorder: Recorder | None = None
        self.broker: RpcBroker | None = None
        self.grants: frozenset[str] = frozenset()
        self.bound: frozenset[str] = frozenset()
        """The grants the kernel's ``mcp_<server>`` proxies were last bound to (a fresh kernel:
        none); the proxies are refreshed before a call when they differ from ``grants``."""
        self.record: SessionRecord | None = None
        """Its generation's record in the store (None until its first sandbox, or if it could not
        be written)."""
        self.journal: SessionJournal | None = None
        self.last_used = time.monotonic()
        self.pending: list[Note] = []
        """Notes for its next result (e.g. that a fresh sandbox was started)."""
        self.claim: Claim | None = None
        """Its name's ownership lock while this bridge holds it (durable sessions)."""
        self.adoption: Adoption | None = None
        """What its sandbox said when this bridge adopted it, until its first result says it."""
        self.torn_journal = False
        self.inherited: list[tuple[Cell, InheritedCell]] = []
        """Cells the bridge before sent, tracked until they end and are journalled."""

    def __repr__(self) -> str:
        return f"<Session {self.name!r} {self._state.value}>"

    # -- state --------------------------------------------------------------------------------------
    @property
    def state(self) -> SessionState:
        return self._state

    def change(self, change: Change, loss: Loss | None = None) -> SessionState:
        """Apply ``change`` (see :func:`~kernelbridge.session.state.next_state`, which raises
        IllegalTransition for a change the table forbids); a LOSE records its ``loss``."""
        previous, self._state = self._state, next_state(self._state, change)
        if change is Change.LOSE and previous is not SessionState.DEAD and self._state is SessionState.DEAD:
            self.loss = loss or Loss.discarded()
        return previous

    @contextlib.contextmanager
    def taken(self) -> Iterator[bool]:
        """Hold the session for one call (its lock is held): TAKE, then RELEASE whatever happens.
        Yields whether this is its first call (it never had a sandbox)."""
        first = self.change(Change.TAKE) is SessionState.NEW
        try:
            yield first
        finally:
            sandbox = self.sandbox
            if self._state is SessionState.BUSY and (sandbox is None or not sandbox.alive):
                self.change(Change.LOSE, died(sandbox.death if sandbox else None))
            self.change(Change.RELEASE)
            self.last_used = time.monotonic()

    def needs_sandbox(self) -> bool:
        """The taken session has no live sandbox (a first call, or it lost its sandbox): DEAD ->
        STARTING when it lost one while this call held it."""
        if self._state is SessionState.BUSY:
            if self.sandbox is not None and self.sandbox.alive:
                return False
            self.change(Change.LOSE, died(self.sandbox.death if self.sandbox else None))
            self.change(Change.TAKE)
        return True

    def release_claim(self) -> None:
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    # -- its sandbox -------------------------------------------------------------------------------
    def take(self, sandbox: Sandbox, origin: Origin) -> None:
        """Make ``sandbox`` the session's (the one place that decides which container is its own):
        its recorder and rpc broker hear it from now on; its kernel has no proxies bound yet."""
        services = self._services
        self.broker = RpcBroker(
            self.name,
            services.dispatch,
            sandbox.agent.answer_rpc,
            services.spawn,
            self.current_grants,
            namespace=services.settings.namespace,
        )
        self.recorder = Recorder(
            services.settings.output_limit,
            on_client_cell=self._journal_client_cell,
            client_execute=sandbox.client_execute,
            on_running=self._cell_running,
            on_display=self._journal_display,
            clock=services.runner.clock.now,
        )
        self.sandbox, self.origin = sandbox, origin
        self.bound = frozenset()
        sandbox.listen(self.handlers())

    def handlers(self) -> SandboxHandlers:
        """How its sandbox reaches it."""
        return SandboxHandlers(self._on_iopub, self._on_reply, self._on_rpc, self._on_end)

    def current_grants(self) -> frozenset[str]:
        return self.grants

    def drop_sandbox(self) -> Sandbox | None:
        """Drop its sandbox (to replace or close it): nothing it says reaches the session any more,
        and its calls are cancelled (they would hold this session's slots in the hub until they
        end). Returns it, to be closed."""
        old, self.sandbox = self.sandbox, None
        self.bound = frozenset()
        if old is not None:
            old.listen(NO_HANDLERS)
        if self.broker is not None:
            self.broker.cancel()
        return old

    async def _on_iopub(self, msg: dict[str, Any]) -> None:
        if self.recorder is not None:
            await self.recorder.on_iopub(msg)

    def _on_reply(self, msg: dict[str, Any]) -> None:
        if self.recorder is not None:
            self.recorder.on_reply(msg)

    async def _on_rpc(self, request: RpcRequest) -> None:
        if self.broker is not None:
            await self.broker.on_request(request)
        elif self.sandbox is not None:
            await self.sandbox.agent.answer_rpc(request.id, error=NoHostServers().to_wire())

    def _on_end(self) -> None:
        """Its sandbox ended: if it died while the session was idle, say so now (``list_sessions``);
        a call in progress finds out by itself."""
        if self.recorder is not None:
            self.recorder.wake_all()
        if self.sandbox is not None and not self.sandbox.alive and self._state is SessionState.IDLE:
            self.change(Change.LOSE, died(self.sandbox.death))

    def _cell_running(self, msg_id: str, running: bool) -> None:
        """Host calls are a running cell's only."""
        if self.broker is not None:
            (self.broker.open_cell if running else self.broker.close_cell)(msg_id)

    async def _journal_client_cell(self, cell: Cell) -> None:
        if self.journal is not None and self.broker is not None:
            await self.journal.append_client(cell, *self.broker.take_cell(cell.msg_id))

    async def _journal_display(self, event: Any, shown: bool) -> None:
        """Display updates of earlier, journalled cells."""
        await on_display(self.journal, event, shown)

    # -- grants --------------------------------------------------------------------------------------
    async def bind_grants(self, granted: frozenset[str], timeout: float) -> None:
        """Grant ``granted`` (for the session's life) and rebind the kernel's proxies when they
        differ from the grants (a silent request whose manifest call the broker admits)."""
        if granted - self.grants:
            self.grants |= granted
            self.write_record()
        if self.grants == self.bound:
            return
        grants = self.grants
        refreshed = await self._refresh_proxies(min(REFRESH_TIMEOUT, timeout))
        if refreshed:
            self.bound = grants
        elif refreshed is not None:
            self.pending.append(ProxiesNotRefreshed())

    async def _refresh_proxies(self, timeout: float) -> bool | None:
        """True: done; False: the kernel refused or did not answer (say so); None: the sandbox
        failed, which the call's own cell will meet and say."""
        sandbox, recorder, broker = self.sandbox, self.recorder, self.broker
        assert sandbox is not None and recorder is not None and broker is not None
        msg_id = uuid.uuid4().hex
        recorder.ignore(msg_id)
        broker.open_cell(msg_id)
        try:
            await sandbox.kernel.execute(REFRESH_CODE, msg_id=msg_id, silent=True)
            reply = await sandbox.kernel.reply(msg_id, timeout)
        except SandboxError as exc:
            log.warning("session %s: refreshing the mcp proxies failed: %s", self.name, exc)
            return None
        finally:
            broker.close_cell(msg_id)
        content = (reply or {}).get("content") or {}
        if content.get("status") == "ok":
            return True
        why = f"{content.get('ename')}: {content.get('evalue')}" if content else "no answer"
        log.warning("session %s: refreshing the mcp proxies failed: %s", self.name, frames.clip(why, 300))
        return False

    # -- one cell ------------------------------------------------------------------------------------
    async def execute(
        self,
        code: str,
        timeout: float,
        *,
        began: float,
        on_progress: ProgressCallback | None = None,
        approve: Approver | None = None,
        label: str | None = None,
        msg_id: str | None = None,
    ) -> CellResult:
        """Run ``code`` as a cell of the taken session under the runner's timeout policy, and
        journal it. ``began``: when the call began waiting for the kernel; ``label``: what runs it
        when that is a long job (an MCP task), said to the calls that queue behind it; ``msg_id``:
        the cell's (a task names its cell, so that a bridge after this one can follow it)."""
        recorder, sandbox = self.recorder, self.sandbox
        assert recorder is not None and sandbox is not None
        # Emptied in place: the session's journal keeps this list to say its failures on (later=).
        notes = self.pending[:]
        self.pending.clear()
        if (background := recorder.take_background()) is not None:
            notes.append(background)
        cell = recorder.expect(msg_id or uuid.uuid4().hex, code)

        async def finish(run: Run) -> CellResult:
            if run.status is Status.CANCELLED and self.leaving:
                # Left running for the next bridge, which journals it as it ends.
                return finish_cell(cell, session=self.name, status=run.status, state=run.state)
            notes[:0] = await self.inherited_notes()
            result = finish_cell(
                cell, session=self.name, status=run.status, state=run.state, notes=notes + run.notes
            )
            if self.broker is not None:
                result.tool_calls, result.packages = self.broker.take_cell(cell.msg_id)
            result.waited_ms = cell.waited_ms() if cell.started is not None else 0
            if self.journal is not None:
                result.notes += await self.journal.append_result(code, result, sorted(self.grants), timeout)
            return result

        self.running = Running(time.monotonic(), label, cell)
        try:
            with approving(self.broker, cell.msg_id, approve):  # its calls ask this call's client
                run = await self._services.runner.run(
                    self, cell, code, timeout, began=began, on_progress=on_progress, on_cancel=finish
                )
        finally:
            self.running = None
            recorder.forget(cell)
        return await finish(run)

    # -- what the cell runner sees (CellTarget) ------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.sandbox is not None and self.sandbox.alive

    @property
    def death(self) -> Death | None:
        return self.sandbox.death if self.sandbox is not None else None

    @property
    def closed(self) -> bool:
        return self._state is SessionState.CLOSED

    @property
    def leaving(self) -> bool:
        return self._services.durable and self._services.leaving.is_set()

    def busy_elsewhere(self, cell: Cell) -> bool:
        return self.recorder is not None and self.recorder.busy_elsewhere(cell)

    async def send(self, code: str, msg_id: str) -> None:
        if self.sandbox is None:
            raise SandboxError(f"session {self.name!r} has no sandbox")
        await self.sandbox.kernel.execute(code, msg_id=msg_id, wait=False)

    async def interrupt(self) -> None:
        if self.sandbox is not None:
            self.sandbox.interrupt()

    async def restart(self, timeout: float) -> bool:
        return self.sandbox is not None and await self.sandbox.restart(timeout)

    def cancel_calls(self, cell: str | None) -> None:
        if self.broker is not None:
            self.broker.cancel(cell)

    def restarted(self) -> None:
        """The kernel was restarted in place: its proxies are gone."""
        self.bound = frozenset()
        self.write_record()

    def discard(self) -> None:
        """Drop the sandbox now; it is closed in the background (bounded)."""
        if self.recorder is not None:
            self.recorder.wake_all()
        sandbox = self.drop_sandbox()
        if self._state is not SessionState.CLOSED:
            self.change(Change.LOSE, Loss.discarded())
        if sandbox is not None:
            self._services.spawn(close_sandbox, sandbox)

    # -- an adopted sandbox's cells ------------------------------------------------------------------
    def inherit(self, adoption: Adoption | None, torn_journal: bool) -> None:
        """Track the cells the bridge before sent whose end it may not have heard."""
        self.adoption, self.torn_journal = adoption, torn_journal
        recorder = self.recorder
        assert recorder is not None
        for said in adoption.cells if adoption is not None else ():
            cell = recorder.inherit(said.msg_id, said.code, running=said.status == "running")
            self.inherited.append((cell, said))

    async def inherited_notes(self) -> list[Note]:
        """For the first result after an adoption: the ``adopted`` note (what ran while no bridge
        was attached), once; the inherited cells that ended are journalled."""
        if self.adoption is None:
            return []
        if any(not cell.done for cell, _ in self.inherited):  # as they stand, with what they printed
            await self.catch_up(CATCH_UP_WAIT)
        note = adopted_note(self.adoption, self.inherited, self.torn_journal)
        self.adoption, self.torn_journal = None, False
        for cell, said in self.inherited:
            if self.recorder is not None:
                self.recorder.forget(cell)
            if self.journal is not None and (cell.done or said.status != "running"):
                result = finish_cell(cell, session=self.name, status=Status.OK, state=State.KEPT)
                await self.journal.append_result(cell.code or said.code, result, sorted(self.grants), None)
        self.inherited = []
        return [note]

    async def catch_up(self, timeout: float) -> None:
        """Hear, within ``timeout``, every message its sandbox sent before now (:func:`catch_up`)."""
        if self.recorder is not None and self.sandbox is not None and self.sandbox.alive:
            if not await catch_up(self.recorder, self.sandbox.kernel, timeout):
                log.info(
                    "session %s: its kernel did not answer on its control channel within %g s: the"
                    " agent's word on the inherited cells stands",
                    self.name,
                    timeout,
                )

    async def follow(
        self, msg_id: str, timeout: float, *, label: str | None = None, since: float | None = None
    ) -> CellResult | None:
        """Wait, as the call that sent it would have, for the inherited cell ``msg_id`` (the
        bridge before sent it and left while it ran) to end: its result, journalled, with the
        ``adopted`` note; None when no such cell was inherited. The session is taken; past
        ``timeout``, or when the wait is cancelled, the cell is interrupted (its state kept).
        ``since``: when (monotonic) the call that sent it began, for its elapsed time."""
        found = next(((cell, said) for cell, said in self.inherited if cell.msg_id == msg_id), None)
        if found is None:
            return None
        cell, said = found
        self.running = Running(since if since is not None else time.monotonic(), label, cell)
        # The agent's word that it ended while no bridge was there: its messages, resent, are heard
        # once caught up (or were dropped past the agent's buffer: then its word is all there is).
        ended = said.status != "running"
        status = Status.OK
        try:
            if ended and not cell.done:
                await self.catch_up(min(timeout, CATCH_UP_WAIT))
            elif not await cell.ended(timeout, self):
                status = Status.TIMEOUT
                await self.interrupt()
                await cell.ended(INTERRUPT_GRACE, self)  # as a timeout does: its state kept
        except anyio.get_cancelled_exc_class():
            if not self.leaving:  # a bridge that leaves lets the cell run on for the next one
                with anyio.CancelScope(shield=True):
                    await self.interrupt()
            raise
        finally:
            self.running = None
        if not cell.done and status is Status.OK:
            status = (Status.ERROR if said.status != "ok" else Status.OK) if ended else Status.KERNEL_DIED
        self.inherited.remove(found)
        notes = await self.inherited_notes()  # the adoption, said once (and the other cells)
        if self.recorder is not None:
            self.recorder.forget(cell)
        state = State.KEPT if self.alive else State.LOST
        result = finish_cell(cell, session=self.name, status=status, state=state, notes=notes)
        if self.journal is not None:
            code, grants = cell.code or said.code, sorted(self.grants)
            result.notes += await self.journal.append_result(code, result, grants, None)
        return result

    # -- record and close ----------------------------------------------------------------------------
    def where(self) -> dict[str, Any]:
        """What its record says of its sandbox."""
        sandbox = self.sandbox
        assert sandbox is not None
        return {
            "connection_file": str(sandbox.connection_file),
            "container": sandbox.container_name,
            "container_id": sandbox.container_id,
            "label": sandbox.container_label,
        }

    def write_record(self) -> None:
        """Its record names its current sandbox and grants (after a replacement, a restart, a grant)."""
        record = self.record
        if record is not None and self.sandbox is not None:
            changes = {**self.where(), "servers": tuple(sorted(self.grants))}
            self.save_record(lambda: self._services.store.update(record, **changes))

    def save_record(self, write: Callable[[], SessionRecord]) -> None:
        # A few hundred bytes, written in place as before: only `kernelbridge sessions` and
        # `attach` miss a record that could not be written.
        try:
            new = write()
        except OSError as exc:
            log.warning("writing the record of session %s failed: %s", self.name, exc.strerror or exc)
            return
        if self._state is not SessionState.CLOSED:
            self.record = new

    async def close(self) -> None:
        """Stop its sandbox (even mid-cell), end its generation, let go of its name."""
        self.change(Change.CLOSE)
        if self.recorder is not None:
            self.recorder.wake_all()
        sandbox = self.drop_sandbox()
        if sandbox is not None:
            await close_sandbox(sandbox)
        await on_display(self.journal, None, False)  # write the updates of journalled cells held
        if self.record is not None:
            record, self.record = self.record, None
            self.save_record(lambda: self._services.store.end(record))
        self.release_claim()

    def listing(self, now: float) -> dict[str, Any]:
        """``list_sessions``' entry."""
        busy = (SessionState.STARTING, SessionState.BUSY)
        return {
            "session": self.name,
            "state": self._state.listed,
            "cells": self.journal.cells if self.journal is not None else 0,
            "idle_seconds": 0 if self._state in busy else round(now - self.last_used),
            "container": self.sandbox.container_name if self.sandbox is not None else None,
            "servers": sorted(self.grants),
            **({"running": self.running.listing(now)} if self.running is not None else {}),
        }


MAX_LISTED_LINE = 200
"""Characters of a running cell's latest output line in a listing or a task's status."""


@dataclass(slots=True)
class Running:
    """The cell a session runs now: since when (monotonic), for whom (a task's label or None)."""

    started: float
    label: str | None
    cell: Cell

    def latest_line(self) -> str:
        """The cell's latest line of stdout (or stderr), bounded."""
        lines = self.cell.outputs.progress_tail(1).strip().splitlines()
        line = lines[-1] if lines else ""
        return line if len(line) <= MAX_LISTED_LINE else line[: MAX_LISTED_LINE - 3] + "..."

    def listing(self, now: float) -> dict[str, Any]:
        return {"seconds": round(now - self.started), "latest_output": self.latest_line(), "task": self.label}


def died(death: Death | None) -> Loss:
    return Loss(death.reason if death is not None else "the sandbox ended while idle")
