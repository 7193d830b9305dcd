"""Closing a registry's sessions, reaping idle ones, and their records (a part of
:class:`~kernelbridge.session.registry.SessionRegistry`, kept apart for its length)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from kernelbridge.config import Settings
from kernelbridge.host import Sandbox, close_sandbox
from kernelbridge.session.named import Session
from kernelbridge.session.outcome import SandboxLost
from kernelbridge.session.recording import on_display
from kernelbridge.session.records import SessionRecord
from kernelbridge.session.state import Change, SessionState
from kernelbridge.session.store import SessionStore, validate_session_name

if TYPE_CHECKING:
    from kernelbridge.session.adopter import Adopter

log = logging.getLogger("kernelbridge.session.registry")


class Closing:
    """See the module docstring."""

    settings: Settings
    store: SessionStore
    lost: dict[str, SandboxLost]
    _sessions: dict[str, Session]
    _adopter: Adopter | None

    # -- closing -------------------------------------------------------------------------------
    async def close(self, name: str) -> bool:
        """Close session ``name`` (stopping its sandbox, even mid-cell; a detached one's too);
        False if it is not open. Raises SessionError when another bridge holds it."""
        session = self._sessions.pop(validate_session_name(name), None)
        if session is None:
            self.lost.pop(name, None)
            return self._adopter is not None and await self._adopter.end_detached(name)
        await self.close_session(session)
        return True

    async def close_session(self, session: Session) -> None:
        session.change(Change.CLOSE)
        seat, session.seat = session.seat, None
        if seat is not None:
            if seat.broker is not None:
                seat.broker.cancel()
            if seat.recorder is not None:
                seat.recorder.wake_all()
            await close_sandbox(seat.sandbox)
        await on_display(session.journal, None, False)  # write the updates of journalled cells held
        if session.record is not None:
            record, session.record = session.record, None
            self._save(session, lambda: self.store.end(record))
        session.release_claim()

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
                    await self.close_session(session)

    # -- records -------------------------------------------------------------------------------
    def _write_record(self, session: Session) -> None:
        """The session's record names its current sandbox (after a replacement or a restart)."""
        record, sandbox = session.record, session.sandbox
        if record is not None and sandbox is not None:
            changes = {**where(sandbox), "servers": tuple(sorted(session.grants))}
            self._save(session, lambda: self.store.update(record, **changes))

    def _save(self, session: Session, write: Callable[[], SessionRecord]) -> None:
        # A few hundred bytes, written in place as before: only `kernelbridge sessions` and
        # `attach` miss a record that could not be written.
        try:
            new = write()
        except OSError as exc:
            log.warning("writing the record of session %s failed: %s", session.name, exc.strerror or exc)
            return
        if session.state is not SessionState.CLOSED:
            session.record = new


def where(sandbox: Sandbox) -> dict[str, Any]:
    """What a session's record says of its sandbox."""
    return {
        "connection_file": str(sandbox.connection_file),
        "container": sandbox.container_name,
        "container_id": sandbox.container_id,
    }
