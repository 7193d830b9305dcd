"""The life of one connection to a host server as a state machine: states, changes, one table.

::

    IDLE --start--> STARTING --started--> READY --exit--> EXITED   (the next call starts a new one)
    STARTING --fail--> FAILED      (calls within START_RETRY_AFTER get its error)
    any state --close--> CLOSED    (the pool is closing: no new connection starts)

Every change goes through :func:`next_state`; a pair not in its table raises IllegalTransition (a
bug). Pure (no I/O, no event loop). Design: docs/design/host.md.
"""

from __future__ import annotations

import enum

from kernelbridge.transitions import TransitionTable


class ClientState(enum.Enum):
    IDLE = "idle"
    """Not started yet."""
    STARTING = "starting"
    READY = "ready"
    EXITED = "exited"
    """The server process ended or the transport failed; the next call restarts it."""
    FAILED = "failed"
    """Its start failed."""
    CLOSED = "closed"


class Change(enum.Enum):
    START = "start"
    """A caller needs the server: its runner starts."""
    STARTED = "started"
    """The client is open and the tools are listed."""
    FAIL = "fail"
    """The start failed (an error, the start timeout)."""
    EXIT = "exit"
    """The transport ended (the process exited, a call saw the stream closed) or the runner left."""
    CLOSE = "close"
    """The pool closes the client."""


_S, _C = ClientState, Change
TRANSITIONS: TransitionTable[ClientState, Change] = TransitionTable(
    "a host server connection",
    {
        (_S.IDLE, _C.START): _S.STARTING,
        (_S.STARTING, _C.STARTED): _S.READY,
        (_S.STARTING, _C.FAIL): _S.FAILED,
        (_S.STARTING, _C.EXIT): _S.STARTING,  # the transport ended mid-start: the start settles it
        (_S.READY, _C.EXIT): _S.EXITED,
        (_S.EXITED, _C.EXIT): _S.EXITED,  # the same end, seen by a call and by the runner
        (_S.FAILED, _C.EXIT): _S.FAILED,  # the runner of a failed start leaves
        **{(state, _C.CLOSE): _S.CLOSED for state in ClientState},
        **{(_S.CLOSED, change): _S.CLOSED for change in (_C.STARTED, _C.FAIL, _C.EXIT)},
    },
)
next_state = TRANSITIONS.next
