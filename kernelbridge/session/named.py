"""One named session of a registry: its state, its sandbox's seat, its grants, journal and claim.

Its state changes only through :meth:`Session.change` (the table of :mod:`kernelbridge.session.state`).
"""

from __future__ import annotations

import time

import anyio

from kernelbridge.host import Sandbox
from kernelbridge.session.cell import Cell
from kernelbridge.session.outcome import Note
from kernelbridge.session.ownership import Claim
from kernelbridge.session.recording import SessionJournal
from kernelbridge.session.records import SessionRecord
from kernelbridge.session.seat import Seat
from kernelbridge.session.state import Change, Loss, SessionState, next_state
from kernelbridge.tunnel import Adoption, InheritedCell


class Session:
    """One named session of a registry: its state, its sandbox's seat, its grants and journal.

    Its state changes only through :meth:`change` (the table of :mod:`kernelbridge.session.state`).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = anyio.Lock()
        """Held by the call that has taken the session."""
        self._state = SessionState.NEW
        self.loss: Loss | None = None
        """Why it lost its sandbox (DEAD), until the next call says so."""
        self.seat: Seat | None = None
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

    def release_claim(self) -> None:
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    def __repr__(self) -> str:
        return f"<Session {self.name!r} {self._state.value}>"

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def sandbox(self) -> Sandbox | None:
        return self.seat.sandbox if self.seat is not None else None

    def change(self, change: Change, loss: Loss | None = None) -> SessionState:
        """Apply ``change`` (see :func:`~kernelbridge.session.state.next_state`, which raises
        IllegalTransition for a change the table forbids); a LOSE records its ``loss``."""
        previous, self._state = self._state, next_state(self._state, change)
        if change is Change.LOSE and previous is not SessionState.DEAD and self._state is SessionState.DEAD:
            self.loss = loss or Loss.discarded()
        return previous
