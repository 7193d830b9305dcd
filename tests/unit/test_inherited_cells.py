"""The cells an adopted sandbox says the bridge before sent: the first result after an adoption is
built once everything the sandbox held back has been heard (``catch_up``: the idle of a control
request of the bridge's own comes behind it), however late a busy machine brings it, and no later.
Seen under load: the ``adopted`` note and the journal lost a finished cell's output that came
0.5 s after the adoption, when the wait for it was a guess in seconds."""

from __future__ import annotations

import math
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup

from kernelbridge.errors import SandboxError
from kernelbridge.session import adoption
from kernelbridge.session.adoption import catch_up, inherited_outcome
from kernelbridge.session.recorder import Recorder
from kernelbridge.tunnel import InheritedCell

pytestmark = pytest.mark.anyio

CODE = "y += 1\nprint('late', y)"
BOUND = 30
"""Hang guard only: every wait below ends on a message, on the sandbox's end, or at a bound of 0."""
CELL = "m1"


def iopub(parent: str, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"header": {"msg_type": msg_type}, "parent_header": {"msg_id": parent}, "content": content}


HELD = [
    iopub(CELL, "status", {"execution_state": "busy"}),
    iopub(CELL, "stream", {"name": "stdout", "text": "late 42\n"}),
    iopub(CELL, "status", {"execution_state": "idle"}),
]
"""What the sandbox held back of a cell that ended while no bridge was attached."""


class Kernel:
    """The sandbox as the bridge's client reaches it: a request sent after the adoption is
    answered behind what the sandbox held back (``held``), or never (``answers=False``: a kernel
    stopped or wedged). ``yields``: checkpoints before each message, as a busy machine's delays."""

    def __init__(
        self, tg: TaskGroup, recorder: Recorder, held: list[dict[str, Any]], *, answers: bool = True
    ) -> None:
        self.tg, self.recorder, self.held, self.answers = tg, recorder, held, answers
        self.yields = 3
        self.sent: list[tuple[str, str]] = []

    async def request(self, channel: str, msg_type: str, content: dict[str, Any], **options: Any) -> str:
        msg_id: str = options["msg_id"]
        self.sent.append((channel, msg_type))
        self.tg.start_soon(self.relay, msg_id)  # sent: what comes back comes later
        return msg_id

    async def relay(self, msg_id: str) -> None:
        idle = iopub(msg_id, "status", {"execution_state": "idle"})
        mark = [iopub(msg_id, "status", {"execution_state": "busy"}), idle] if self.answers else []
        if self.held:  # the cell's reply, held back with its output
            self.recorder.on_reply(
                {"parent_header": {"msg_id": CELL}, "content": {"status": "ok", "execution_count": 3}}
            )
        for msg in [*self.held, *mark]:
            for _ in range(self.yields):
                await anyio.lowlevel.checkpoint()
            await self.recorder.on_iopub(msg)


def adopted(status: str) -> tuple[Recorder, InheritedCell]:
    recorder = Recorder(10_000)
    recorder.inherit(CELL, CODE, running=status == "running")
    return recorder, InheritedCell(CELL, CODE, status, 3)


async def test_what_the_sandbox_held_back_is_heard_before_the_note_is_built() -> None:
    recorder, said = adopted("ok")
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            kernel = Kernel(tg, recorder, HELD)
            kernel.yields = 50  # late: many turns of the event loop between the messages
            assert await catch_up(recorder, kernel, math.inf)
            outcome = inherited_outcome(recorder.cells[CELL], said)  # as soon as the wait ends
    assert (outcome.status, outcome.output, outcome.heard) == ("ok", "late 42", True)
    assert kernel.sent == [("control", "kernel_info_request")], "answered even while a cell runs"
    assert not recorder.marks, "the mark is forgotten once heard"


async def caught_up(recorder: Recorder, held: list[dict[str, Any]], timeout: float, **kernel: Any) -> bool:
    async with anyio.create_task_group() as tg:
        caught = await catch_up(recorder, Kernel(tg, recorder, held, **kernel), timeout)
    return caught


async def test_the_marks_own_messages_are_nobodys_output() -> None:
    recorder, _ = adopted("ok")
    with anyio.fail_after(BOUND):
        assert await caught_up(recorder, [], math.inf)
    assert recorder.take_background() is None
    assert list(recorder.cells) == [CELL]


async def test_an_ended_cell_whose_messages_were_dropped_keeps_the_agents_word() -> None:
    recorder, said = adopted("error")
    with anyio.fail_after(BOUND):
        assert await caught_up(recorder, [], math.inf)
    outcome = inherited_outcome(recorder.cells[CELL], said)
    assert (outcome.status, outcome.output, outcome.heard) == ("error", "", False)


async def test_a_running_cell_stands_as_running_once_caught_up() -> None:
    recorder, said = adopted("running")
    with anyio.fail_after(BOUND):
        assert await caught_up(recorder, [], math.inf)
    assert inherited_outcome(recorder.cells[CELL], said).status == "running"


async def test_a_kernel_that_never_answers_is_waited_for_up_to_the_bound_only() -> None:
    recorder, said = adopted("ok")
    with anyio.fail_after(BOUND):
        assert not await caught_up(recorder, [], 0.0, answers=False)
    assert inherited_outcome(recorder.cells[CELL], said).status == "ok"
    assert not recorder.marks
    assert adoption.CATCH_UP_WAIT < BOUND


async def test_a_sandbox_that_ends_ends_the_wait() -> None:
    # No bound: only the sandbox's end can stop the wait (else the hang guard fires).
    recorder, _ = adopted("ok")
    caught: list[bool] = []

    async def first_result() -> None:
        caught.append(await caught_up(recorder, [], math.inf, answers=False))

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first_result)
            await anyio.wait_all_tasks_blocked()
            recorder.wake_all()  # what the session does when its sandbox ends
    assert caught == [True]


async def test_a_sandbox_no_longer_running_is_not_waited_on() -> None:
    recorder, _ = adopted("ok")

    class Gone:
        async def request(self, *args: Any, **kwargs: Any) -> str:
            raise SandboxError("the sandbox is not running")

    with anyio.fail_after(BOUND):
        assert await catch_up(recorder, Gone(), math.inf)
