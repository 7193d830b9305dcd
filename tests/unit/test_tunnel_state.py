"""A tunnel's state machine: a start, an adoption, restarts, the end; a ready the sandbox sends at
the wrong moment is refused by the table, and the owner's bugs raise."""

from __future__ import annotations

import pytest

from kernelbridge.errors import IllegalTransition
from kernelbridge.tunnel.state import Change, TunnelState, accepts, next_state

S, C = TunnelState, Change


def walk(start: TunnelState, *changes: Change) -> list[TunnelState]:
    states, state = [], start
    for change in changes:
        state = next_state(state, change)
        states.append(state)
    return states


def test_a_new_sandbox_starts_restarts_and_ends() -> None:
    assert walk(S.STARTING, C.READY, C.RESTART, C.RESTART, C.READY, C.END) == [
        S.READY, S.RESTARTING, S.RESTARTING, S.READY, S.ENDED,
    ]  # fmt: skip


def test_an_adopted_sandbox_proves_itself_before_it_is_ready() -> None:
    assert walk(S.ADOPTING, C.CHALLENGE, C.ADOPTED, C.RESTART, C.READY) == [
        S.PROVING, S.READY, S.RESTARTING, S.READY,
    ]  # fmt: skip
    assert [s for s in S if s.handshaking] == [S.ADOPTING, S.PROVING]


@pytest.mark.parametrize("state", [s for s in TunnelState if s is not TunnelState.ENDED])
def test_every_state_but_the_end_can_end(state: TunnelState) -> None:
    assert next_state(state, C.END) is S.ENDED


def test_a_ready_is_accepted_only_while_a_start_or_restart_is_pending() -> None:
    assert {s for s in S if accepts(s, C.READY)} == {S.STARTING, S.RESTARTING}


@pytest.mark.parametrize(
    ("state", "change"),
    [(S.READY, C.READY), (S.STARTING, C.RESTART), (S.ADOPTING, C.RESTART), (S.PROVING, C.READY),
     (S.ADOPTING, C.ADOPTED), (S.READY, C.CHALLENGE), (S.ENDED, C.END), (S.ENDED, C.READY)],
)  # fmt: skip
def test_illegal_changes_raise(state: TunnelState, change: Change) -> None:
    with pytest.raises(IllegalTransition, match=f"a tunnel that is {state.value} cannot take"):
        next_state(state, change)
