"""The agent's two state machines, each behind one table: the host link's and the poll loop's.

Every change goes through :func:`next_link_state` or :func:`next_phase`; a pair their table does not
have raises :class:`IllegalTransition` (a bug). Leaving a link that is no longer attached (an EOF,
then a queued ``detach``) is legal and changes nothing. Pure: tests drive it directly::

    link:  AWAITING_HELLO --hello--> ATTACHED --leave--> ENDED          (a plain link)
                                     ATTACHED --detach--> DETACHED --expire--> ENDED  (durable)
                                     DETACHED --adopt--> ATTACHED
    loop:  STARTING --booted--> RELAYING --shutdown_reply--> SHUTTING_DOWN
           RELAYING or SHUTTING_DOWN --restart--> STARTING;  any but FINISHED --finish--> FINISHED
"""

from __future__ import annotations

import enum

from kernelbridge.transitions import IllegalTransition as IllegalTransition
from kernelbridge.transitions import TransitionTable


class LinkState(enum.Enum):
    AWAITING_HELLO = "awaiting hello"
    """Started: the first frame must be the host's ``hello``."""
    ATTACHED = "attached"
    """A host's hello was accepted: its frames go to the relay, the agent's frames go to it."""
    DETACHED = "detached"
    """A durable sandbox whose host has gone: it runs on and holds its frames for the next host."""
    ENDED = "ended"
    """The host has gone and none will come again: the agent stops."""


class LinkChange(enum.Enum):
    HELLO = "hello"
    """The host's hello was accepted."""
    LEAVE = "leave"
    """The host of a plain link (or one that never said hello) has gone."""
    DETACH = "detach"
    """The host of a durable link has gone."""
    EXPIRE = "expire"
    """No host came back within the idle timeout."""
    ADOPT = "adopt"
    """A new host proved itself and its pipes are the link's."""


_L, _LC = LinkState, LinkChange
_LINK: TransitionTable[LinkState, LinkChange] = TransitionTable(
    "a host link",
    {
        (_L.AWAITING_HELLO, _LC.HELLO): _L.ATTACHED,
        (_L.AWAITING_HELLO, _LC.LEAVE): _L.ENDED,
        (_L.ATTACHED, _LC.LEAVE): _L.ENDED,
        (_L.ENDED, _LC.LEAVE): _L.ENDED,  # a broken write after stdin's EOF
        (_L.ATTACHED, _LC.DETACH): _L.DETACHED,
        (_L.DETACHED, _LC.DETACH): _L.DETACHED,  # a queued ``detach`` read after the EOF
        (_L.ENDED, _LC.DETACH): _L.ENDED,
        (_L.DETACHED, _LC.EXPIRE): _L.ENDED,
        (_L.DETACHED, _LC.ADOPT): _L.ATTACHED,
    },
)


class Phase(enum.Enum):
    STARTING = "starting"
    """No kernel yet, or a new one proving that iopub delivers."""
    RELAYING = "relaying"
    SHUTTING_DOWN = "shutting down"
    """The kernel answered a shutdown_request: it ends by itself or is stopped after the grace."""
    FINISHED = "finished"
    """The agent exits with its status."""


class PhaseChange(enum.Enum):
    BOOTED = "booted"
    """The kernel proved iopub delivers and ``ready`` was sent."""
    SHUTDOWN_REPLY = "shutdown_reply"
    """The kernel answered a shutdown_request."""
    RESTART = "restart"
    """The host asked for a new kernel in the same container."""
    FINISH = "finish"
    """The agent is done (asked to stop, the host gone, the kernel ended, or a start failed)."""


_P, _PC = Phase, PhaseChange
_LOOP: TransitionTable[Phase, PhaseChange] = TransitionTable(
    "an agent",
    {
        (_P.STARTING, _PC.BOOTED): _P.RELAYING,
        (_P.RELAYING, _PC.SHUTDOWN_REPLY): _P.SHUTTING_DOWN,
        (_P.RELAYING, _PC.RESTART): _P.STARTING,
        (_P.SHUTTING_DOWN, _PC.RESTART): _P.STARTING,
        **{(phase, _PC.FINISH): _P.FINISHED for phase in Phase if phase is not _P.FINISHED},
    },
)


def next_link_state(state: LinkState, change: LinkChange) -> LinkState:
    """The link's state after ``change``. Raises IllegalTransition for a pair the table lacks."""
    return _LINK.next(state, change)


def next_phase(phase: Phase, change: PhaseChange) -> Phase:
    """The loop's phase after ``change``. Raises IllegalTransition for a pair the table lacks."""
    return _LOOP.next(phase, change)
