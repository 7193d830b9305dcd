"""The life of one session as a state machine (docs/architecture.md, "A session's life").

Every change goes through :func:`next_state`; a pair not in its table raises IllegalTransition (a
bug: e.g. releasing a session nobody took). Events a sandbox or a closing registry can cause at any
moment are legal and change nothing (a sandbox ending after its session was closed). What
``list_sessions`` shows is :attr:`SessionState.listed`. Pure (no I/O, no event loop).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kernelbridge.transitions import TransitionTable


class SessionState(enum.Enum):
    NEW = "new"
    """In the registry, never had a sandbox (the first call is on its way)."""
    STARTING = "starting"
    """A call is getting it a sandbox: its first one, or a fresh one after it lost one."""
    IDLE = "idle"
    """A live sandbox, no call running."""
    BUSY = "busy"
    """A call runs on its live sandbox."""
    DEAD = "dead"
    """It lost its sandbox (see its :class:`Loss`); the next call starts a fresh one."""
    CLOSED = "closed"
    """Closed (``close_session``, idle, the bridge stopping, a failed first start); gone."""

    @property
    def listed(self) -> str:
        """The state ``list_sessions`` shows (``starting`` | ``idle`` | ``busy`` | ``dead``)."""
        return "starting" if self in (SessionState.NEW, SessionState.STARTING) else self.value


class Change(enum.Enum):
    TAKE = "take"
    """A call holds the session (its lock) from now on."""
    STARTED = "started"
    """The call gave it a live sandbox."""
    RELEASE = "release"
    """The call that held it returned."""
    LOSE = "lose"
    """Its sandbox died, was discarded, or could not be started."""
    CLOSE = "close"


_S, _C = SessionState, Change
TRANSITIONS: TransitionTable[SessionState, Change] = TransitionTable(
    "a session",
    {
        (_S.NEW, _C.TAKE): _S.STARTING,
        (_S.DEAD, _C.TAKE): _S.STARTING,
        (_S.IDLE, _C.TAKE): _S.BUSY,
        (_S.STARTING, _C.STARTED): _S.BUSY,
        (_S.BUSY, _C.RELEASE): _S.IDLE,
        (_S.DEAD, _C.RELEASE): _S.DEAD,  # the call that lost the sandbox returns
        (_S.CLOSED, _C.RELEASE): _S.CLOSED,  # a call returns after close_session ended its session
        **{(state, _C.LOSE): _S.DEAD for state in (_S.STARTING, _S.BUSY, _S.IDLE)},
        (_S.DEAD, _C.LOSE): _S.DEAD,  # a sandbox the session had already lost ends
        (_S.CLOSED, _C.LOSE): _S.CLOSED,  # the sandbox of a closed session ends
        **{(state, _C.CLOSE): _S.CLOSED for state in SessionState},
    },
)
next_state = TRANSITIONS.next


@dataclass(frozen=True, slots=True)
class Loss:
    """Why a session lost its sandbox, said by the next call (a :class:`FreshSandbox` note)."""

    died: str | None
    """How it died (the sandbox's one line); None: it was discarded by the bridge."""

    @classmethod
    def discarded(cls) -> Loss:
        return cls(None)
