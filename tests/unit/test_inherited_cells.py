"""The cells an adopted sandbox says the bridge before sent: the first result after an adoption
waits for the resent messages of a cell the agent says ended, however late a busy machine brings
them (within ENDED_WAIT), and only briefly for one still running. Seen under load: the ``adopted``
note and the journal lost a finished cell's output that came 0.5 s after the adoption."""

from __future__ import annotations

import math
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from kernelbridge.session import adoption
from kernelbridge.session.adoption import await_inherited, inherited_outcome
from kernelbridge.session.cell import Cell
from kernelbridge.session.outcome import InheritedOutcome
from kernelbridge.tunnel import InheritedCell

pytestmark = pytest.mark.anyio

CODE = "y += 1\nprint('late', y)"
BOUND = 30
"""Hang guard only: every wait below is cut to nothing, or ends on a message."""


class Sandbox:
    """The adopted sandbox, as the wait sees it."""

    def __init__(self, alive: bool = True) -> None:
        self.alive = alive


def inherited(status: str) -> tuple[Cell, InheritedCell]:
    return Cell("m1", 10_000, code=CODE), InheritedCell("m1", CODE, status, 3)


def resend(cell: Cell, messages: list[tuple[str, dict[str, Any]]]) -> None:
    for msg_type, content in messages:
        cell.on_iopub(msg_type, content)
    cell.on_reply({"status": "ok", "execution_count": 3})


ENDED = [
    ("status", {"execution_state": "busy"}),
    ("stream", {"name": "stdout", "text": "late 42\n"}),
    ("status", {"execution_state": "idle"}),
]


async def test_an_ended_cells_messages_are_awaited_past_the_running_cells_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No wait at all for a running cell: only the ended cell's own bound can let its messages in.
    monkeypatch.setattr(adoption, "INHERITED_WAIT", 0.0)
    pair = inherited("ok")
    said: list[InheritedOutcome] = []

    async def first_result() -> None:
        await await_inherited([pair], Sandbox())
        said.append(inherited_outcome(*pair))  # what the note says, as soon as the wait ends

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first_result)
            # The waiter waits, and the running cells' bound (none) has passed: a checkpoint lets
            # its deadline fire. Only then do the messages come.
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()
            await anyio.wait_all_tasks_blocked()
            resend(pair[0], ENDED)
    (outcome,) = said
    assert (outcome.status, outcome.output, outcome.heard) == ("ok", "late 42", True)


async def test_a_running_cell_is_not_awaited_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adoption, "INHERITED_WAIT", 0.0)
    pair = inherited("running")
    with anyio.fail_after(BOUND):
        await await_inherited([pair], Sandbox())
    assert not pair[0].done
    assert inherited_outcome(*pair).status == "running"


async def test_an_ended_cell_whose_messages_were_dropped_keeps_the_agents_word(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adoption, "ENDED_WAIT", 0.0)
    pair = inherited("error")
    with anyio.fail_after(BOUND):
        await await_inherited([pair], Sandbox())
    outcome = inherited_outcome(*pair)
    assert (outcome.status, outcome.output, outcome.heard) == ("error", "", False)


async def test_a_sandbox_that_ended_is_not_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # No bound at all for the ended cell: only the sandbox's end can stop the wait (else the hang
    # guard fires). Its messages can no longer come.
    monkeypatch.setattr(adoption, "ENDED_WAIT", math.inf)
    pair = inherited("ok")
    with anyio.fail_after(BOUND):
        await await_inherited([pair], Sandbox(alive=False))
    assert inherited_outcome(*pair).status == "ok"
