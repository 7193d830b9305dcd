"""A registry's durable sessions: held, adopted, let go of, listed and ended (``settings.durable``).

The decisions are :mod:`.adoption`'s (is this container ours, alive, what was lost, what the first
result says); this is the registry's side of them, one :class:`Adopter` per registry:

- **hold** a session name before it gets a sandbox (the ownership lock, :mod:`.ownership`): a name
  another live bridge holds is refused with one line (:class:`~kernelbridge.errors.SessionError`);
  the second bridge never writes to that sandbox;
- **adopt** the sandbox its current record names, if that one outlived its bridge: the engine says
  it runs and is labelled ours, the sandbox proves it knows the secret and the bridge the same
  (``Sandbox.adopt``); the journal goes on where it stopped; the cells the bridge before left
  running are tracked to their end and journalled; the first result says ``adopted``. Anything
  short of that ends the generation ``lost`` and, if it had cells, the call answers with
  :class:`Lost` (nothing ran; ``restore=`` is offered), else the session starts afresh, saying so;
- **let go** of every sandbox when the bridge leaves (``detach``: it runs on, its record says
  when), the warm pool's too (their records in the store's ``warm`` directory: the next bridge
  adopts them into its pool before it starts any);
- **list** this namespace's sessions that run detached (or that another bridge holds), and **end**
  a detached one (``close_session``, ``kernelbridge sessions close``) without adopting it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from kernelbridge.errors import AdoptionFailed, KernelBridgeError, RuntimeUnavailable, SessionError
from kernelbridge.host import Sandbox, WarmPool, close_sandbox
from kernelbridge.runtime import RuntimeBackend
from kernelbridge.session import adoption
from kernelbridge.session.cell import CellResult, finish_cell
from kernelbridge.session.named import Session
from kernelbridge.session.outcome import Note, SandboxLost, State, Status
from kernelbridge.session.ownership import Claim
from kernelbridge.session.recorder import Recorder
from kernelbridge.session.recording import SessionJournal
from kernelbridge.session.records import SessionRecord, WarmRecord
from kernelbridge.session.seat import Seat
from kernelbridge.session.state import Change
from kernelbridge.session.store import SessionStore

if TYPE_CHECKING:
    from kernelbridge.session.registry import SessionRegistry

log = logging.getLogger(__name__)

INHERITED_WAIT = 0.5
"""How long a first result waits for an inherited cell that is about to end (its reply in flight)."""
WARM_ADOPT_TIMEOUT = 20.0


class Lost(SessionError):
    """The session's sandbox outlived its bridge but is gone or unusable; its cells are in the
    journal (``note.restore``). Raised before any code ran (a caller that does not look for it
    gets one line, as for any SessionError)."""

    def __init__(self, note: SandboxLost) -> None:
        super().__init__(note.reason)
        self.note = note


def lost_result(name: str, note: SandboxLost) -> CellResult:
    """The result of a call that found its session's sandbox lost: nothing ran."""
    return CellResult(
        status=Status.KERNEL_DIED,
        session=name,
        execution_count=None,
        stdout="",
        stderr="",
        result=None,
        error=None,
        truncated=False,
        duration_ms=0,
        state=State.LOST,
        notes=[replace(note, ran=False)],
    )


class Adopter:
    """See the module docstring."""

    def __init__(self, registry: SessionRegistry) -> None:
        self._registry = registry
        self.store = registry.store
        self.settings = registry.settings
        self.adopted_at_start = anyio.Event()
        """Set once :meth:`adopt_all` is done (each session adopted, found lost, or left be)."""

    # -- start: the warm pool a bridge before left -----------------------------------------------
    async def open(self, tg: anyio.abc.TaskGroup, pool: WarmPool[Seat]) -> None:
        """Adopt the warm sandboxes a bridge before left, into ``pool`` (in parallel, bounded)."""
        try:
            found = await anyio.to_thread.run_sync(self.store.warm)
        except OSError as exc:
            log.warning("reading the warm pool's records failed: %s", exc)
            return
        if not found:
            return
        with anyio.move_on_after(WARM_ADOPT_TIMEOUT):
            async with anyio.create_task_group() as group:
                for record, held in found:
                    group.start_soon(self._adopt_warm, tg, pool, record, held)

    async def _adopt_warm(
        self, tg: anyio.abc.TaskGroup, pool: WarmPool[Seat], record: WarmRecord, held: Claim
    ) -> None:
        secret = self.store.warm_secret(record)
        try:
            info = await adoption.inspect(self._registry.runtime, record.container_id)
        except (RuntimeUnavailable, TimeoutError) as exc:
            log.warning("warm sandbox %s: the engine did not answer: %s", record.container, exc)
            held.release()
            return
        from kernelbridge.host.container import STATE_LABEL, state_identity

        usable = (
            info is not None
            and info.durable
            and info.labels.get(STATE_LABEL) == state_identity(self.settings.state_dir)
            and info.state.value == "running"
            and secret is not None
            and len(pool) < self.settings.warm_pool
        )
        if not usable or secret is None:
            self.store.drop_warm(record.container)
            held.release()
            if info is not None and info.labels.get(STATE_LABEL) == state_identity(self.settings.state_dir):
                await adoption.remove(self._registry.runtime, record.container_id)
            return
        sandbox = self._adopted_sandbox(record.container, record.container_id, record.container, secret)
        seat = Seat(sandbox)
        try:
            await tg.start(partial(sandbox.run, seat.handlers()))
        except KernelBridgeError as exc:
            log.warning("warm sandbox %s could not be adopted: %s", record.container, exc)
            self.store.drop_warm(record.container)
            held.release()
            return
        sandbox.resume()
        seat.warm, seat.claim = replace(record, owner_pid=os.getpid(), detached=None), held
        pool.add(seat)

    async def adopt_all(self) -> None:
        """At start, in the background: adopt every session of this namespace whose sandbox
        outlived its bridge (in parallel, at most the session limit), so that its first call finds
        it attached (a warm call; the ``adopted`` note still comes with that first result). A
        sandbox found lost is said by the session's next call."""
        try:
            records = await anyio.to_thread.run_sync(self.store.adoptable)
        except OSError as exc:
            log.warning("reading the session records failed: %s", exc)
            records = []
        try:
            async with anyio.create_task_group() as tg:
                for record in records[: self.settings.max_sessions]:
                    tg.start_soon(self._adopt_early, record.session)
        finally:
            self.adopted_at_start.set()

    async def _adopt_early(self, name: str) -> None:
        try:
            await self._registry.sandbox(name)
        except Lost as exc:
            self._registry.lost[name] = exc.note
        except KernelBridgeError as exc:  # held by another bridge meanwhile, the engine is down
            log.info("session %s was not adopted at start: %s", name, exc)

    def keep_warm(self, seat: Seat) -> None:
        """A durable warm sandbox was started: keep its record and secret for a later bridge."""
        sandbox = seat.sandbox
        if sandbox.durability is None or sandbox.container_id is None:
            return
        record = WarmRecord(
            sandbox.container_name, sandbox.container_id, time.time(), os.getpid(), socket.gethostname()
        )
        seat.claim = self.store.save_warm(record, sandbox.durability.secret)
        seat.warm = record if seat.claim is not None else None

    def _adopted_sandbox(self, name: str, container_id: str, container: str, secret: str) -> Sandbox:
        registry = self._registry
        return Sandbox.adopt(
            self.settings,
            registry.runtime,
            name,
            container_id=container_id,
            container_name=container,
            secret=secret,
            agent_hash=registry.agent_hash,
        )

    # -- a session's first use ----------------------------------------------------------------------
    async def hold(self, session: Session) -> SessionRecord | None:
        """Take ``session``'s name (raises SessionError if another bridge holds it); its current
        record if that names a sandbox that may have outlived its bridge."""
        try:
            held = await anyio.to_thread.run_sync(self.store.claim, session.name)
        except OSError as exc:
            log.warning("the ownership lock of session %s failed: %s", session.name, exc)
            return None
        if held is None:
            raise SessionError(
                f"session {session.name!r} is held by another kernelbridge on this state directory "
                "(one bridge per session at a time); use another session name, or close that bridge"
            )
        session.claim = held
        record = await anyio.to_thread.run_sync(self.store.current, session.name)
        return record if record is not None and record.adoptable else None

    def record_of(self, name: str) -> SessionRecord | None:
        record = self.store.current(name)
        return record if record is not None and record.adoptable else None

    async def adopt(self, session: Session, record: SessionRecord, budget: tuple[int, str]) -> Seat | None:
        """Take over ``record``'s sandbox for ``session`` (its seat, the session STARTED), or None
        after saying why it could not be (a fresh one follows). Raises Lost (it had cells)."""
        registry = self._registry
        secret = self.store.secret(record)
        assert record.container_id is not None
        try:
            info = await adoption.inspect(registry.runtime, record.container_id)
        except TimeoutError:
            raise SessionError(
                "the container engine did not answer (the session's sandbox may still run)"
            ) from None
        loss = adoption.check_container(info, record, self.settings.state_dir, secret)
        if loss is None and secret is not None:
            sandbox = self._adopted_sandbox(session.name, record.container_id, record.container or "", secret)
            seat = Seat(sandbox)
            try:
                await registry.task_group.start(partial(sandbox.run, seat.handlers()))
            except AdoptionFailed as exc:
                loss = adoption.Loss(exc.reason, False)
            except KernelBridgeError as exc:
                loss = adoption.Loss(str(exc), False)
            else:
                await self._seated(session, seat, record, budget)
                return seat
        assert loss is not None
        await self._lost(session, record, loss)
        return None

    async def _seated(
        self, session: Session, seat: Seat, record: SessionRecord, budget: tuple[int, str]
    ) -> None:
        registry = self._registry
        sandbox = seat.sandbox
        registry.attach(session, seat)
        session.change(Change.STARTED)
        session.grants = session.bound = frozenset(record.servers)
        session.adoption = sandbox.adoption
        session.journal, session.torn_journal = await SessionJournal.resume(
            self.store, record, budget, quota=self.settings.disk_quota, later=session.pending
        )
        where = {
            "owner_pid": os.getpid(),
            "owner_host": socket.gethostname(),
            "detached": None,
            "connection_file": str(sandbox.connection_file),
        }
        try:
            session.record = await anyio.to_thread.run_sync(lambda: self.store.update(record, **where))
        except OSError as exc:
            log.warning("updating the record of session %s failed: %s", session.name, exc)
            session.record = record
        recorder = seat.recorder
        assert recorder is not None
        if session.adoption is not None:
            for said in session.adoption.cells:
                cell = recorder.inherit(said.msg_id, said.code, running=said.status == "running")
                session.inherited.append((cell, said))
        sandbox.resume()  # the handlers are ready: what it held back may come now
        log.info("adopted the sandbox of session %s (%s)", session.name, record.container)

    async def _lost(self, session: Session, record: SessionRecord, loss: adoption.Loss) -> None:
        log.info("session %s: its sandbox could not be adopted: %s", session.name, loss.reason)
        try:
            await anyio.to_thread.run_sync(self.store.lose, record, loss.reason)
        except OSError as exc:
            log.warning("ending the record of session %s failed: %s", session.name, exc)
        if loss.remove and record.container_id:
            await adoption.remove(self._registry.runtime, record.container_id)
        cells = await anyio.to_thread.run_sync(adoption.journal_cells, self.store, record)
        note = adoption.lost_note(record, loss, cells)
        if cells:
            raise Lost(note)
        session.pending.append(note)

    # -- a session's sandbox ----------------------------------------------------------------------
    def secret_for(self, seat: Seat) -> str | None:
        """The secret to keep in a new generation's record (the sandbox's own), and the seat leaves
        the warm pool's records."""
        if seat.warm is not None:
            self.store.drop_warm(seat.warm.container)
            seat.warm = None
        seat.release_warm()
        durability = seat.sandbox.durability
        return durability.secret if durability is not None else None

    def rekey(self, session: Session, seat: Seat) -> None:
        """A replacement sandbox (the old one died): its record keeps the new sandbox's secret."""
        secret = self.secret_for(seat)
        if session.record is not None and secret is not None:
            try:
                session.record = self.store.rekey(session.record, secret)
            except OSError as exc:
                log.warning("keeping the secret of session %s failed: %s", session.name, exc)

    async def inherited(self, session: Session, recorder: Recorder) -> list[Note]:
        """For the session's first result after an adoption: the ``adopted`` note (what ran while
        no bridge was attached), once; the inherited cells that ended are journalled."""
        if session.adoption is None:
            return []
        with anyio.move_on_after(INHERITED_WAIT):
            for cell, _ in session.inherited:
                while not cell.done:
                    await cell.change_event.wait()
        note = adoption.adopted_note(session.adoption, session.inherited, session.torn_journal)
        session.adoption, session.torn_journal = None, False
        for cell, said in session.inherited:
            recorder.forget(cell)
            if session.journal is not None and (cell.done or said.status != "running"):
                result = finish_cell(cell, session=session.name, status=Status.OK, state=State.KEPT)
                code = cell.code or said.code
                await session.journal.append_result(code, result, sorted(session.grants), None)
        session.inherited = []
        return [note]

    # -- the bridge leaves -------------------------------------------------------------------------
    async def detach(self, session: Session) -> None:
        """Let go of ``session``'s sandbox (it runs on for the next bridge); close it if it cannot
        be let go of (not ready, dead)."""
        sandbox, record = session.sandbox, session.record
        if sandbox is not None and record is not None and record.durable and await sandbox.detach():
            try:
                await anyio.to_thread.run_sync(self.store.detach, record)
            except OSError as exc:
                log.warning("recording that session %s was detached failed: %s", session.name, exc)
            session.release_claim()
            return
        await self._registry.close_session(session)

    async def detach_warm(self, seat: Seat) -> None:
        if seat.warm is not None and await seat.sandbox.detach():
            self.store.detach_warm(seat.warm)
            seat.release_warm()
            return
        if seat.warm is not None:
            self.store.drop_warm(seat.warm.container)
        seat.release_warm()
        await close_sandbox(seat.sandbox)

    # -- other bridges' and nobody's sessions ------------------------------------------------------
    def listing(self, open_here: set[str]) -> list[dict[str, Any]]:
        """This namespace's sessions whose sandbox may run without this bridge."""
        shown = []
        for record in self.store.records():
            if record.session in open_here or not record.adoptable:
                continue
            held = self.store.holder(record)
            shown.append(
                {
                    "session": record.session,
                    "state": "elsewhere" if held else "detached",
                    "generation": record.generation,
                    "detached_since": record.detached,
                }
            )
        return shown

    async def end_detached(self, name: str) -> bool:
        """End session ``name``'s detached sandbox without adopting it; False if there is none.
        Raises SessionError when another bridge holds it."""
        record = await anyio.to_thread.run_sync(self.record_of, name)
        if record is None:
            return False
        held = await anyio.to_thread.run_sync(self.store.claim, name)
        if held is None:
            raise SessionError(f"session {name!r} is held by another kernelbridge on this state directory")
        try:
            await end_record(self._registry.runtime, self.store, record, self.settings.state_dir)
        finally:
            held.release()
        return True


async def end_record(
    runtime: RuntimeBackend, store: SessionStore, record: SessionRecord, state_dir: Path
) -> None:
    """Remove ``record``'s container if it is ours (labels), and end the generation."""
    if record.container_id:
        try:
            info = await adoption.inspect(runtime, record.container_id)
        except (RuntimeUnavailable, TimeoutError):
            info = None
        if info is not None and adoption.ours(info, record, state_dir):
            await adoption.remove(runtime, record.container_id)
    await anyio.to_thread.run_sync(store.end, record)
