"""One state machine's table: which change takes which state where.

    TABLE = TransitionTable("a tunnel", {(TunnelState.READY, Change.RESTART): TunnelState.RESTARTING})
    state = TABLE.next(state, Change.RESTART)   # IllegalTransition for a pair the table lacks
    if TABLE.accepts(state, change): ...        # for events untrusted input may send at any time

Every state enum of the bridge and of the agent in the sandbox sits behind one (standard library
only: the image carries this module beside the frame codec).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar


class IllegalTransition(RuntimeError):
    """A state machine was asked for a change its table forbids: a bug in kernelbridge, not
    something a sandbox or a user can cause (what they can cause is a legal, ignored event)."""


S = TypeVar("S", bound=enum.Enum)
C = TypeVar("C", bound=enum.Enum)


class TransitionTable(Generic[S, C]):
    """``what`` names the machine in the error (``"a tunnel"``: "a tunnel that is ended cannot ...")."""

    __slots__ = ("_table", "what")

    def __init__(self, what: str, table: Mapping[tuple[S, C], S]) -> None:
        self.what = what
        self._table = dict(table)

    def accepts(self, state: S, change: C) -> bool:
        return (state, change) in self._table

    def next(self, state: S, change: C) -> S:
        """The state after ``change``. Raises IllegalTransition for a pair the table lacks."""
        try:
            return self._table[(state, change)]
        except KeyError:
            raise IllegalTransition(
                f"{self.what} that is {state.value} cannot take {change.value!r}"
            ) from None
