"""A host server connection's state machine: a start, a failed start, an exit, the pool's close,
what races it, and the pairs that are bugs."""

from __future__ import annotations

import pytest

from kernelbridge.errors import IllegalTransition
from kernelbridge.hub.client_state import Change, ClientState, next_state

S, C = ClientState, Change


def walk(*changes: Change, start: ClientState = S.IDLE) -> list[ClientState]:
    states, state = [], start
    for change in changes:
        state = next_state(state, change)
        states.append(state)
    return states


def test_the_lives_of_a_connection() -> None:
    assert walk(C.START, C.STARTED, C.EXIT, C.EXIT) == [S.STARTING, S.READY, S.EXITED, S.EXITED]
    # the process died mid-start: the transport's end changes nothing, the start's failure does
    assert walk(C.START, C.EXIT, C.FAIL, C.EXIT) == [S.STARTING, S.STARTING, S.FAILED, S.FAILED]
    assert walk(C.START, C.STARTED, C.CLOSE, C.EXIT) == [S.STARTING, S.READY, S.CLOSED, S.CLOSED]


@pytest.mark.parametrize("state", list(ClientState))
def test_the_pool_closes_a_connection_in_any_state(state: ClientState) -> None:
    assert next_state(state, C.CLOSE) is S.CLOSED


@pytest.mark.parametrize("change", [C.STARTED, C.FAIL, C.EXIT, C.CLOSE])
def test_a_start_settling_after_the_close_changes_nothing(change: Change) -> None:
    assert next_state(S.CLOSED, change) is S.CLOSED


@pytest.mark.parametrize(
    ("state", "change"),
    [(S.READY, C.START), (S.STARTING, C.START), (S.EXITED, C.START), (S.FAILED, C.START), (S.CLOSED, C.START),
     (S.IDLE, C.STARTED), (S.IDLE, C.EXIT), (S.READY, C.FAIL), (S.EXITED, C.STARTED), (S.FAILED, C.STARTED)],
)  # fmt: skip
def test_illegal_changes_raise(state: ClientState, change: Change) -> None:
    with pytest.raises(IllegalTransition, match=f"connection that is {state.value} cannot take"):
        next_state(state, change)
