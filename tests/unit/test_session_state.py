"""A session's state machine: the paths a session takes, the changes it ignores, and the ones
that are bugs."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kernelbridge.calls import NO_HUB
from kernelbridge.config import Settings
from kernelbridge.errors import IllegalTransition
from kernelbridge.session.registry import Session
from kernelbridge.session.runner import CellRunner
from kernelbridge.session.session import Services
from kernelbridge.session.state import Change, Loss, SessionState, next_state
from kernelbridge.session.store import SessionStore

S, C = SessionState, Change


def services_for(state_dir: Path) -> Services:
    """What a registry gives its sessions; this test needs none of it (no sandbox, no calls)."""
    settings = Settings(state_dir=state_dir)
    runner = CellRunner(max_timeout=settings.max_timeout)
    return Services(settings, SessionStore.of(settings), runner, NO_HUB, print, anyio.Event(), False)


def walk(*changes: Change, start: SessionState = S.NEW) -> list[SessionState]:
    states, state = [], start
    for change in changes:
        state = next_state(state, change)
        states.append(state)
    return states


def test_the_lives_of_a_session() -> None:
    # first call, a second call, the sandbox dies during a third, a fresh one on the fourth, closed
    assert walk(C.TAKE, C.STARTED, C.RELEASE, C.TAKE, C.RELEASE, C.TAKE, C.LOSE, C.RELEASE,
                C.TAKE, C.STARTED, C.RELEASE, C.CLOSE) == [
        S.STARTING, S.BUSY, S.IDLE, S.BUSY, S.IDLE, S.BUSY, S.DEAD, S.DEAD,
        S.STARTING, S.BUSY, S.IDLE, S.CLOSED,
    ]  # fmt: skip
    assert walk(C.TAKE, C.CLOSE) == [S.STARTING, S.CLOSED]  # a first start that failed
    assert walk(C.LOSE, start=S.IDLE) == [S.DEAD]  # died while idle
    assert walk(C.LOSE, start=S.STARTING) == [S.DEAD]  # a replacement that did not start


def test_what_a_sandbox_or_a_close_can_cause_at_any_time_is_legal_and_changes_nothing_more() -> None:
    assert next_state(S.DEAD, C.LOSE) is S.DEAD
    assert next_state(S.CLOSED, C.LOSE) is S.CLOSED  # the sandbox of a closed session ends
    assert next_state(S.CLOSED, C.RELEASE) is S.CLOSED  # a call returns after close_session
    assert all(next_state(state, C.CLOSE) is S.CLOSED for state in SessionState)


@pytest.mark.parametrize(
    ("state", "change"),
    [(S.BUSY, C.TAKE), (S.STARTING, C.TAKE), (S.NEW, C.RELEASE), (S.IDLE, C.RELEASE),
     (S.IDLE, C.STARTED), (S.NEW, C.LOSE), (S.CLOSED, C.TAKE), (S.CLOSED, C.STARTED)],
)  # fmt: skip
def test_illegal_changes_raise(state: SessionState, change: Change) -> None:
    with pytest.raises(IllegalTransition, match=f"a session that is {state.value} cannot take"):
        next_state(state, change)


def test_a_session_shows_its_state_keeps_its_first_loss_and_lists_the_public_names(tmp_path: Path) -> None:
    session = Session("s", services_for(tmp_path))
    assert repr(session) == "<Session 's' new>" and session.state.listed == "starting"
    for change in (C.TAKE, C.STARTED, C.RELEASE):
        session.change(change)
    assert repr(session) == "<Session 's' idle>" and session.loss is None
    session.change(C.LOSE, Loss("out of memory"))
    session.change(C.LOSE, Loss.discarded())  # its end, reported later: the first loss stands
    assert session.loss == Loss("out of memory") and session.state.listed == "dead"
    with pytest.raises(IllegalTransition):
        session.change(C.STARTED)  # no call is starting it
    assert session.state is S.DEAD  # a refused change changes nothing
    assert [s.listed for s in SessionState] == ["starting", "starting", "idle", "busy", "dead", "closed"]
