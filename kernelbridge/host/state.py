"""The life of one sandbox as a state machine: its states, what changes them, and the one table.

::

    STARTING --ready--> READY --restart--> RESTARTING --ready--> READY
    any live state --end--> DEAD       any live state --close--> CLOSING --end--> CLOSED
    READY, RESTARTING --detach--> DETACHING --end--> DETACHED   (it runs on: durable)

Every change goes through :func:`next_state`; a pair not in its table raises IllegalTransition (a
bug). A close or a detach stands against a ``ready`` racing it, so its end is never recorded as a
death. Pure (no I/O, no event loop). Design: docs/design/host.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kernelbridge.errors import ExitKind
from kernelbridge.transitions import TransitionTable


class SandboxState(enum.Enum):
    STARTING = "starting"
    """The container runs; its kernel has not proved iopub delivers yet."""
    READY = "ready"
    RESTARTING = "restarting"
    """A new kernel is starting in the same container."""
    CLOSING = "closing"
    """The owner asked it to stop; requests are refused from here on."""
    DEAD = "dead"
    """It ended by itself (see the owner's ``death``)."""
    CLOSED = "closed"
    DETACHING = "detaching"
    """The owner lets go of it (a durable sandbox): it keeps running, without this bridge."""
    DETACHED = "detached"
    """The tunnel ended after a detach: the sandbox runs on; a later bridge may adopt it."""

    @property
    def alive(self) -> bool:
        """Whether the sandbox takes requests."""
        return self in (SandboxState.STARTING, SandboxState.READY, SandboxState.RESTARTING)


class Change(enum.Enum):
    READY = "ready"
    """The tunnel reported ``ready`` (the kernel proved iopub delivers)."""
    RESTART = "restart"
    """The owner sent a restart."""
    CLOSE = "close"
    """The owner asked the sandbox to stop."""
    END = "end"
    """The tunnel ended (the container's stdout closed), or the owner gave up on it."""
    DETACH = "detach"
    """The owner lets go of a durable sandbox (the bridge is leaving)."""


_S, _C = SandboxState, Change
TRANSITIONS: TransitionTable[SandboxState, Change] = TransitionTable(
    "a sandbox",
    {
        (_S.STARTING, _C.READY): _S.READY,
        (_S.RESTARTING, _C.READY): _S.READY,
        (_S.CLOSING, _C.READY): _S.CLOSING,  # a restart's answer racing the close: the close stands
        (_S.READY, _C.RESTART): _S.RESTARTING,
        (_S.RESTARTING, _C.RESTART): _S.RESTARTING,  # restarting again (the first did not answer)
        **{(state, _C.CLOSE): _S.CLOSING for state in (_S.STARTING, _S.READY, _S.RESTARTING, _S.CLOSING)},
        (_S.DEAD, _C.CLOSE): _S.DEAD,
        (_S.CLOSED, _C.CLOSE): _S.CLOSED,
        **{(state, _C.END): _S.DEAD for state in (_S.STARTING, _S.READY, _S.RESTARTING)},
        (_S.CLOSING, _C.END): _S.CLOSED,
        # Only a sandbox with a ready kernel is let go of; one still starting holds nothing yet.
        **{(state, _C.DETACH): _S.DETACHING for state in (_S.READY, _S.RESTARTING)},
        **{
            (state, _C.DETACH): state
            for state in (_S.STARTING, _S.DETACHING, _S.DETACHED, _S.CLOSING, _S.CLOSED, _S.DEAD)
        },
        (_S.DETACHING, _C.END): _S.DETACHED,
        (_S.DETACHING, _C.READY): _S.DETACHING,
        (_S.DETACHING, _C.CLOSE): _S.DETACHING,
        (_S.DETACHED, _C.CLOSE): _S.DETACHED,
    },
)
next_state = TRANSITIONS.next


@dataclass(frozen=True, slots=True)
class Death:
    """Why a sandbox ended by itself."""

    kind: ExitKind
    reason: str
    """One line for a model or a person."""
