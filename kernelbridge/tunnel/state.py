"""The life of one tunnel as a state machine: its states, what changes them, and the one table.

::

    STARTING --ready--> READY --restart--> RESTARTING --ready--> READY
    ADOPTING --challenge--> PROVING --adopted--> READY      (a sandbox that outlived its bridge)
    any state but ENDED --end--> ENDED

Every change goes through :func:`next_state`; a pair that is not in its table raises
IllegalTransition (a bug: the owner restarts only a ready sandbox). A frame the sandbox sends at
the wrong moment is untrusted input, not a bug: the tunnel asks :func:`accepts` first and drops it.
Pure (no I/O, no event loop): tests drive it directly.
"""

from __future__ import annotations

import enum

from kernelbridge.transitions import TransitionTable


class TunnelState(enum.Enum):
    STARTING = "starting"
    """``hello`` sent; waiting for the sandbox's ``ready``."""
    ADOPTING = "adopting"
    """Waiting for an adopted sandbox's ``challenge``."""
    PROVING = "proving"
    """Answered the challenge; waiting for ``adopted``."""
    READY = "ready"
    RESTARTING = "restarting"
    """The owner's ``restart`` is written; waiting for the new kernel's ``ready``."""
    ENDED = "ended"

    @property
    def handshaking(self) -> bool:
        """An adopted sandbox's handshake runs: its frames are not numbered, nothing is acked."""
        return self in (TunnelState.ADOPTING, TunnelState.PROVING)


class Change(enum.Enum):
    READY = "ready"
    """The sandbox said ``ready``."""
    RESTART = "restart"
    """The owner's ``restart`` goes to the sandbox."""
    CHALLENGE = "challenge"
    """The adopted sandbox's challenge was answered with this bridge's proof."""
    ADOPTED = "adopted"
    """The adopted sandbox's ``adopted`` frame carried the right proof."""
    END = "end"
    """The stream ended, the handshake failed, or the tunnel was cancelled."""


_S, _C = TunnelState, Change
TRANSITIONS: TransitionTable[TunnelState, Change] = TransitionTable(
    "a tunnel",
    {
        (_S.STARTING, _C.READY): _S.READY,
        (_S.RESTARTING, _C.READY): _S.READY,
        (_S.READY, _C.RESTART): _S.RESTARTING,
        (_S.RESTARTING, _C.RESTART): _S.RESTARTING,  # restarting again (the first did not answer)
        (_S.ADOPTING, _C.CHALLENGE): _S.PROVING,
        (_S.PROVING, _C.ADOPTED): _S.READY,
        **{(state, _C.END): _S.ENDED for state in TunnelState if state is not _S.ENDED},
    },
)
accepts = TRANSITIONS.accepts
next_state = TRANSITIONS.next
