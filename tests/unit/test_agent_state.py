"""The agent's two state machines (the host link's, the poll loop's): their paths, the departures
that race and change nothing, and the pairs that are bugs."""

from __future__ import annotations

import pytest

from kernelbridge.inside.agent.state import (
    IllegalTransition,
    LinkChange,
    LinkState,
    Phase,
    PhaseChange,
    next_link_state,
    next_phase,
)

L, LC, P, PC = LinkState, LinkChange, Phase, PhaseChange


def link_walk(*changes: LinkChange) -> list[LinkState]:
    states, state = [], L.AWAITING_HELLO
    for change in changes:
        state = next_link_state(state, change)
        states.append(state)
    return states


def phase_walk(*changes: PhaseChange) -> list[Phase]:
    phases, phase = [], P.STARTING
    for change in changes:
        phase = next_phase(phase, change)
        phases.append(phase)
    return phases


def test_the_lives_of_a_link() -> None:
    assert link_walk(LC.HELLO, LC.LEAVE) == [L.ATTACHED, L.ENDED]  # a plain link's host goes
    assert link_walk(LC.LEAVE) == [L.ENDED]  # no hello at all
    # durable: detached, adopted by a second host, detached again, nobody came back
    assert link_walk(LC.HELLO, LC.DETACH, LC.ADOPT, LC.DETACH, LC.EXPIRE) == [
        L.ATTACHED, L.DETACHED, L.ATTACHED, L.DETACHED, L.ENDED,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "change"), [(L.DETACHED, LC.DETACH), (L.ENDED, LC.DETACH), (L.ENDED, LC.LEAVE)]
)
def test_a_host_leaving_a_link_it_already_left_changes_nothing(state: LinkState, change: LinkChange) -> None:
    assert next_link_state(state, change) is state


@pytest.mark.parametrize(
    ("state", "change"),
    [(L.ATTACHED, LC.HELLO), (L.AWAITING_HELLO, LC.DETACH), (L.ATTACHED, LC.ADOPT), (L.ENDED, LC.ADOPT),
     (L.ATTACHED, LC.EXPIRE), (L.DETACHED, LC.HELLO), (L.ENDED, LC.HELLO)],
)  # fmt: skip
def test_illegal_link_changes_raise(state: LinkState, change: LinkChange) -> None:
    with pytest.raises(IllegalTransition, match=f"a host link that is {state.value} cannot take"):
        next_link_state(state, change)


def test_the_lives_of_the_loop() -> None:
    assert phase_walk(PC.BOOTED, PC.RESTART, PC.BOOTED, PC.SHUTDOWN_REPLY, PC.FINISH) == [
        P.RELAYING, P.STARTING, P.RELAYING, P.SHUTTING_DOWN, P.FINISHED,
    ]  # fmt: skip
    assert phase_walk(PC.FINISH) == [P.FINISHED]  # a refused hello, a kernel that never started
    assert phase_walk(PC.BOOTED, PC.SHUTDOWN_REPLY, PC.RESTART) == [P.RELAYING, P.SHUTTING_DOWN, P.STARTING]


@pytest.mark.parametrize(
    ("phase", "change"),
    [(P.STARTING, PC.SHUTDOWN_REPLY), (P.STARTING, PC.RESTART), (P.RELAYING, PC.BOOTED),
     (P.SHUTTING_DOWN, PC.SHUTDOWN_REPLY), (P.FINISHED, PC.FINISH), (P.FINISHED, PC.RESTART)],
)  # fmt: skip
def test_illegal_phase_changes_raise(phase: Phase, change: PhaseChange) -> None:
    with pytest.raises(IllegalTransition, match=f"an agent that is {phase.value} cannot take"):
        next_phase(phase, change)
