"""Sessions that outlive their bridge: the service a durable registry asks (``settings.durable``).

It answers with sandboxes or losses (:class:`~.adoption.Loss`); it holds no session map and never
calls back into the registry. The decisions (is this container ours, alive, what was lost) are
:mod:`.adoption`'s, the name's lock :mod:`.ownership`'s.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from kernelbridge.config import Settings
from kernelbridge.errors import AdoptionFailed, KernelBridgeError, RuntimeUnavailable, SessionError
from kernelbridge.host import Sandbox, WarmPool, close_sandbox
from kernelbridge.host.container import STATE_LABEL, container_spec, state_identity
from kernelbridge.runtime import ContainerState, RuntimeBackend
from kernelbridge.runtime.reaper import own_start
from kernelbridge.session import adoption
from kernelbridge.session.cell import CellResult
from kernelbridge.session.outcome import SandboxLost, State, Status
from kernelbridge.session.ownership import Claim
from kernelbridge.session.records import SessionRecord, Standing, WarmRecord
from kernelbridge.session.session import Origin
from kernelbridge.session.store import SessionStore

log = logging.getLogger(__name__)

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


@dataclass(eq=False, slots=True)
class WarmSandbox:
    """A sandbox the warm pool hands out, with (durable) its record and lock in the store."""

    sandbox: Sandbox
    origin: Origin
    """WARM: started ahead of need (or adopted into the pool); COLD: started for the session."""
    record: WarmRecord | None = None
    claim: Claim | None = None

    def release(self) -> None:
        """It left the pool (a session took it, or it was closed): let go of its lock."""
        if self.claim is not None:
            self.claim.release()
            self.claim = None


class Durability:
    """See the module docstring. One per durable registry."""

    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        runtime: RuntimeBackend,
        *,
        image: str,
        agent_hash: str | None,
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self.settings = settings
        self.store = store
        self.runtime = runtime
        warm = container_spec(settings, "warm", image, agent_hash=agent_hash, durable=True)
        self.warm_shape = warm.shape
        """What this bridge's warm sandboxes are made with: one made otherwise is not pooled."""
        self.mounts_shape = warm.mounts_shape
        """The host directories this bridge's sandboxes see: a session seeing others is not adopted."""
        self.agent_hash = agent_hash
        self._tg = task_group
        self.adopted_at_start = anyio.Event()
        """Set once the sessions found at start are adopted, lost or left be (the registry's)."""

    # -- the warm pool a bridge before left ----------------------------------------------------------
    async def adopt_warm(self, pool: WarmPool[WarmSandbox]) -> None:
        """Adopt the warm sandboxes a bridge before left into ``pool`` (in parallel, bounded)."""
        try:
            found = await anyio.to_thread.run_sync(self.store.warm)
        except OSError as exc:
            log.warning("reading the warm pool's records failed: %s", exc)
            return
        with anyio.move_on_after(WARM_ADOPT_TIMEOUT):
            async with anyio.create_task_group() as group:
                for record, held in found:
                    group.start_soon(self._adopt_warm, pool, record, held)

    async def _adopt_warm(self, pool: WarmPool[WarmSandbox], record: WarmRecord, held: Claim) -> None:
        secret = self.store.warm_secret(record)
        try:
            info = await adoption.inspect(self.runtime, record.container_id)
        except (RuntimeUnavailable, TimeoutError) as exc:
            log.warning("warm sandbox %s: the engine did not answer: %s", record.container, exc)
            held.release()
            return
        ours = info is not None and info.labels.get(STATE_LABEL) == state_identity(self.settings.state_dir)
        # The shape covers the agent too (the spec labels it): an earlier kernelbridge's has none.
        stale = info is not None and info.shape != self.warm_shape
        if info is not None and ours and stale:
            # Made otherwise (another image, a mount taken away, other limits, an earlier
            # kernelbridge): a new session must get what this bridge's settings say.
            log.info(
                "warm sandbox %s was made with other settings than this bridge's: removed", record.container
            )
        if (
            info is None
            or not ours
            or stale
            or not info.durable
            or info.state is not ContainerState.RUNNING
            or secret is None
            or len(pool) >= self.settings.warm_pool
        ):
            self.store.drop_warm(record.container)
            held.release()
            if ours and info is not None:
                await adoption.remove(self.runtime, record.container_id)
            return
        sandbox = self._adopted(record.container, record.container_id, record.container, info.session, secret)
        try:
            await self._tg.start(sandbox.run)
        except KernelBridgeError as exc:
            log.warning("warm sandbox %s could not be adopted: %s", record.container, exc)
            self.store.drop_warm(record.container)
            held.release()
            return
        sandbox.resume()
        taken = replace(record, owner_pid=os.getpid(), owner_start=own_start(), detached=None)
        pool.add(WarmSandbox(sandbox, Origin.WARM, taken, held))

    def keep_warm(self, warm: WarmSandbox) -> None:
        """A durable warm sandbox was started: keep its record and secret for a later bridge."""
        sandbox = warm.sandbox
        if sandbox.durability is None or sandbox.container_id is None:
            return
        record = WarmRecord(
            sandbox.container_name,
            sandbox.container_id,
            time.time(),
            os.getpid(),
            socket.gethostname(),
            owner_start=own_start(),
        )
        warm.claim = self.store.save_warm(record, sandbox.durability.secret)
        warm.record = record if warm.claim is not None else None

    def secret_of(self, warm: WarmSandbox) -> str | None:
        """A session takes ``warm``: the secret its record keeps (the sandbox's own); the sandbox
        leaves the warm pool's records."""
        if warm.record is not None:
            self.store.drop_warm(warm.record.container)
            warm.record = None
        warm.release()
        durability = warm.sandbox.durability
        return durability.secret if durability is not None else None

    # -- a session's first use -----------------------------------------------------------------------
    async def hold(self, name: str) -> tuple[Claim | None, SessionRecord | None]:
        """Take ``name``'s ownership lock (raises SessionError if another bridge holds it; None
        if the lock cannot be taken at all, logged), and its current record if that names a
        sandbox that may have outlived its bridge."""
        try:
            held = await anyio.to_thread.run_sync(self.store.claim, name)
        except OSError as exc:
            log.warning("the ownership lock of session %s failed: %s", name, exc)
            return None, None
        if held is None:
            raise SessionError(
                f"session {name!r} is held by another kernelbridge on this state directory "
                "(one bridge per session at a time); use another session name, or close that bridge"
            )
        record = await anyio.to_thread.run_sync(self.store.current, name)
        return held, record if record is not None and record.adoptable else None

    def record_of(self, name: str) -> SessionRecord | None:
        """``name``'s current record, if it names a sandbox that may have outlived its bridge."""
        record = self.store.current(name)
        return record if record is not None and record.adoptable else None

    async def adoptable(self) -> list[SessionRecord]:
        """The records of this namespace whose sandbox a bridge could adopt, none held."""
        try:
            records = await anyio.to_thread.run_sync(self.store.adoptable)
        except OSError as exc:
            log.warning("reading the session records failed: %s", exc)
            return []
        return records[: self.settings.max_sessions]

    async def adopt(self, name: str, record: SessionRecord) -> Sandbox | adoption.Loss:
        """Take over ``record``'s sandbox for session ``name``: started (the proof done, what it
        held back not yet resumed), or why it cannot be. Raises SessionError (the engine does
        not answer: nothing can be said, so nothing is lost)."""
        secret = self.store.secret(record)
        assert record.container_id is not None
        try:
            info = await adoption.inspect(self.runtime, record.container_id)
        except (TimeoutError, RuntimeUnavailable) as exc:
            raise SessionError(
                f"the container engine did not answer (the session's sandbox may still run): {exc}"
            ) from None
        loss = adoption.check_container(
            info, record, self.settings.state_dir, secret, self.agent_hash, self.mounts_shape
        )
        if loss is not None or secret is None:
            return loss or adoption.Loss("its secret is missing", True)
        sandbox = self._adopted(
            name, record.container_id, record.container or "", record.container_label, secret
        )
        try:
            await self._tg.start(sandbox.run)
        except AdoptionFailed as exc:
            return adoption.Loss(exc.reason, False)
        except KernelBridgeError as exc:
            return adoption.Loss(str(exc), False)
        return sandbox

    async def taken_over(self, record: SessionRecord, sandbox: Sandbox) -> SessionRecord:
        """``record`` rewritten for this bridge, which now holds its adopted ``sandbox``."""
        where = {
            "owner_pid": os.getpid(),
            "owner_start": own_start(),
            "owner_host": socket.gethostname(),
            "detached": None,
            "connection_file": str(sandbox.connection_file),
        }
        try:
            return await anyio.to_thread.run_sync(lambda: self.store.update(record, **where))
        except OSError as exc:
            log.warning("updating the record of session %s failed: %s", record.session, exc)
            return record

    async def lose(self, record: SessionRecord, loss: adoption.Loss) -> SandboxLost:
        """End ``record``'s generation ``lost`` (its container removed if it is ours and unusable);
        the note that says so."""
        log.info("session %s: its sandbox could not be adopted: %s", record.session, loss.reason)
        try:
            await anyio.to_thread.run_sync(self.store.lose, record, loss.reason)
        except OSError as exc:
            log.warning("ending the record of session %s failed: %s", record.session, exc)
        if loss.remove and record.container_id:
            await adoption.remove(self.runtime, record.container_id)
        cells = await anyio.to_thread.run_sync(adoption.journal_cells, self.store, record)
        return adoption.lost_note(record, loss, cells)

    def rekey(self, record: SessionRecord, sandbox: Sandbox) -> SessionRecord:
        """A replacement sandbox (the old one died): the record keeps the new sandbox's secret."""
        durability = sandbox.durability
        if durability is None:
            return record
        try:
            return self.store.rekey(record, durability.secret)
        except OSError as exc:
            log.warning("keeping the secret of session %s failed: %s", record.session, exc)
            return record

    def _adopted(self, name: str, container_id: str, container: str, label: str, secret: str) -> Sandbox:
        return Sandbox.adopt(
            self.settings,
            self.runtime,
            name,
            container_id=container_id,
            container_name=container,
            container_label=label,
            secret=secret,
            agent_hash=self.agent_hash,
        )

    # -- the bridge leaves ---------------------------------------------------------------------------
    async def detach(self, sandbox: Sandbox | None, record: SessionRecord | None) -> bool:
        """Let go of a session's sandbox (it runs on for the next bridge, its record says since
        when); False when it cannot be (not durable, not ready, dead): close it instead."""
        if sandbox is None or record is None or not record.durable or not await sandbox.detach():
            return False
        try:
            await anyio.to_thread.run_sync(self.store.detach, record)
        except OSError as exc:
            log.warning("recording that session %s was detached failed: %s", record.session, exc)
        return True

    async def detach_warm(self, warm: WarmSandbox) -> None:
        if warm.record is not None and await warm.sandbox.detach():
            self.store.detach_warm(warm.record)
            warm.release()
            return
        if warm.record is not None:
            self.store.drop_warm(warm.record.container)
        warm.release()
        await close_sandbox(warm.sandbox)

    # -- other bridges' and nobody's sessions ----------------------------------------------------------
    def listing(self, open_here: set[str]) -> list[dict[str, Any]]:
        """This namespace's sessions whose sandbox runs without this bridge: ``detached`` (the
        next use adopts it) or ``attached`` to another bridge (``elsewhere``: not usable here)."""
        shown = []
        for record in self.store.records():
            if record.session in open_here or not record.adoptable:
                continue
            standing = self.store.standing(record)
            entry: dict[str, Any] = {
                "session": record.session,
                "state": standing.value,
                "generation": record.generation,
                "detached_since": record.detached,
            }
            if standing is Standing.ATTACHED:
                entry["elsewhere"] = True
            shown.append(entry)
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
            await end_record(self.runtime, self.store, record, self.settings.state_dir)
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
