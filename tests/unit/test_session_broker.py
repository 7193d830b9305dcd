"""RpcBroker (one session's host calls) with a scripted dispatch at its seam: admission, answers,
cancellation per cell, and the bounds on what it records."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import pytest

from kernelbridge import frames
from kernelbridge.calls import RpcCall
from kernelbridge.errors import RpcError
from kernelbridge.session.broker import MAX_HELD_BYTES, MAX_RECORDED_BYTES, RpcBroker
from kernelbridge.tunnel import RpcRequest

pytestmark = pytest.mark.anyio

TIMEOUT = 10.0


class Host:
    """A dispatch that answers ``echo`` at once and holds ``block`` until released."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.cancelled = 0
        self.answers: dict[int, dict[str, Any]] = {}
        self.answered = anyio.Event()
        self.expected = 0
        self._each: dict[int, anyio.Event] = {}

    async def dispatch(self, call: RpcCall) -> Any:
        params, session = call.params, call.session
        assert isinstance(params, dict)
        if params.get("tool") == "boom":
            raise KeyError("a bug")
        if params.get("tool") == "refuse":
            raise RpcError("denied", "refused by the host")
        if params.get("tool") == "block":
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled += 1
                raise
        return params.get("arguments", {}).get("result", {"session": session})

    async def answer(self, request_id: int, **answer: Any) -> None:
        self.answers[request_id] = answer
        self._each.setdefault(request_id, anyio.Event()).set()
        if len(self.answers) >= self.expected:
            self.answered.set()

    async def answer_of(self, request_id: int) -> dict[str, Any]:
        await self._each.setdefault(request_id, anyio.Event()).wait()
        return self.answers[request_id]


@pytest.fixture
async def task_group() -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


def broker_for(
    host: Host,
    tg: anyio.abc.TaskGroup,
    session: str = "s",
    cells: tuple[str, ...] = ("cell-1", "slow", "other"),
) -> RpcBroker:
    broker = RpcBroker(session, host, host.answer, tg.start_soon, lambda: frozenset({"edge"}))
    for cell in cells:  # what the session does for the cells it runs
        broker.open_cell(cell)
    return broker


def request(request_id: int, tool: str = "echo", cell: str | None = "cell-1", **arguments: Any) -> RpcRequest:
    params = {"server": "edge", "tool": tool, "arguments": arguments}
    return RpcRequest(request_id, "call_tool", params, cell)


async def test_a_burst_is_answered_or_refused_at_once(task_group: anyio.abc.TaskGroup) -> None:
    host = Host()
    host.expected = 5000
    broker = broker_for(host, task_group)
    with anyio.fail_after(TIMEOUT):
        for i in range(1, 5001):
            await broker.on_request(request(i, "block"))
        assert broker.in_flight == frames.MAX_RPC_IN_FLIGHT
        busy = [i for i, a in host.answers.items() if a.get("error", {}).get("kind") == "busy"]
        assert len(busy) == 5000 - frames.MAX_RPC_IN_FLIGHT  # refused before any call finished
        host.release.set()
        await host.answered.wait()
    assert sum("result" in a for a in host.answers.values()) == frames.MAX_RPC_IN_FLIGHT
    assert broker.in_flight == 0


async def test_a_cells_calls_are_cancelled_and_answered_cancelled(task_group: anyio.abc.TaskGroup) -> None:
    host = Host()
    host.expected = 3
    broker = broker_for(host, task_group)
    await broker.on_request(request(1, "block", cell="slow"))
    await broker.on_request(request(2, "block", cell="other"))
    await broker.on_request(request(3, "echo", cell="slow"))
    with anyio.fail_after(TIMEOUT):
        await host.answer_of(3)
        assert broker.cancel("slow") == 1
        cancelled = await host.answer_of(1)
    assert cancelled["error"]["kind"] == "cancelled" and host.cancelled == 1
    assert 2 not in host.answers and broker.in_flight == 1
    records = broker.take_records("slow")
    outcomes = [(r.ok, (r.error or "").split(":")[0]) for r in records]
    assert outcomes == [(True, ""), (False, "cancelled")]
    broker.cancel()
    with anyio.fail_after(TIMEOUT):
        await host.answered.wait()


async def test_recorded_data_is_bounded_in_all(task_group: anyio.abc.TaskGroup) -> None:
    host = Host()
    calls = 3 * MAX_HELD_BYTES // MAX_RECORDED_BYTES
    host.expected = calls
    broker = broker_for(host, task_group)
    big = {"text": "x" * (MAX_RECORDED_BYTES - 100)}
    with anyio.fail_after(TIMEOUT):
        for i in range(1, calls + 1):
            await broker.on_request(request(i, result=big))
            await host.answer_of(i)
    assert broker.held_bytes <= MAX_HELD_BYTES
    records = broker.take_records("cell-1")
    assert len(records) == calls and all(r.ok for r in records)  # every call is still recorded
    kept = sum(not r.result_truncated for r in records) + sum(not r.arguments_truncated for r in records)
    assert 0 < kept < 2 * calls and records[-1].result_truncated
    assert records[-1].to_json()["result_truncated"] is True and "result" not in records[-1].to_json()
    assert broker.held_bytes == 0  # collected


async def test_two_sessions_with_the_same_ids_get_their_own_answers(task_group: anyio.abc.TaskGroup) -> None:
    hosts = [Host(), Host()]
    brokers = [broker_for(host, task_group, session) for host, session in zip(hosts, ("a", "b"), strict=True)]
    for host in hosts:
        host.expected = 50
    with anyio.fail_after(TIMEOUT):
        for i in range(1, 51):
            for broker in brokers:
                await broker.on_request(request(i))
        for host in hosts:
            await host.answered.wait()
    for host, session in zip(hosts, ("a", "b"), strict=True):
        assert {a["result"]["session"] for a in host.answers.values()} == {session}


async def test_refusals_pass_through_and_bugs_are_internal(
    task_group: anyio.abc.TaskGroup, caplog: pytest.LogCaptureFixture
) -> None:
    host = Host()
    host.expected = 2
    broker = broker_for(host, task_group)
    await broker.on_request(request(1, "refuse"))
    await broker.on_request(request(2, "boom"))
    with anyio.fail_after(TIMEOUT):
        await host.answered.wait()
    assert host.answers[1]["error"] == {"kind": "denied", "message": "refused by the host"}
    assert (
        host.answers[2]["error"]["kind"] == "internal" and "a bug" not in host.answers[2]["error"]["message"]
    )
    (logged,) = [r for r in caplog.records if "rpc call failed" in r.getMessage()]
    assert logged.levelname == "ERROR" and logged.exc_info is not None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_call_belongs_to_a_running_cell_or_is_refused(task_group: anyio.abc.TaskGroup) -> None:
    """Issue 13: a forged or stale ``cell`` never gives a call a life of its own."""
    host, clock = Host(), Clock()
    broker = RpcBroker(
        "s", host, host.answer, task_group.start_soon, lambda: frozenset({"edge"}), clock=clock
    )
    with anyio.fail_after(TIMEOUT):
        await broker.on_request(request(1, cell="made-up"))  # nothing runs: refused at once
        refused = await host.answer_of(1)
        assert refused["error"]["kind"] == "cancelled"
        assert "not running" in refused["error"]["message"] and "\n" not in refused["error"]["message"]
        await broker.on_request(request(2, cell=None))
        assert (await host.answer_of(2))["error"]["kind"] == "cancelled"

        broker.open_cell("real")
        await broker.on_request(request(3, "block", cell="made-up"))  # attributed to "real"
        await broker.on_request(request(4, "block", cell="real"))
        await anyio.wait_all_tasks_blocked()
        assert broker.in_flight == 2
        assert broker.cancel("real") == 2  # the forged claim is cancelled with the cell it ran in
        assert (await host.answer_of(3))["error"]["kind"] == "cancelled"
        assert (await host.answer_of(4))["error"]["kind"] == "cancelled"
        assert {r.ok for r in broker.take_records("real")} == {False} and not broker.take_records("made-up")

        broker.close_cell("real")
        clock.now += 1.0  # a task created by the cell's last line: still its call
        await broker.on_request(request(5, cell="real"))
        assert "result" in await host.answer_of(5)
        clock.now += 5.0  # long after: refused
        await broker.on_request(request(6, cell="real"))
        assert (await host.answer_of(6))["error"]["kind"] == "cancelled"
    assert broker.refused == 3


async def test_a_call_that_arrives_before_its_cell_begins_waits_for_it(
    task_group: anyio.abc.TaskGroup,
) -> None:
    """A Jupyter client's cell begins when the recorder reads its iopub, which travels apart from
    the rpc frames: a call from its first line may come first, and is admitted once it begins."""
    host = Host()
    broker = RpcBroker("s", host, host.answer, task_group.start_soon, lambda: frozenset({"edge"}))
    with anyio.fail_after(TIMEOUT):
        await broker.on_request(request(1, cell="client-cell"))
        await anyio.wait_all_tasks_blocked()
        assert 1 not in host.answers, "neither refused nor run before the cell begins"
        broker.open_cell("client-cell")
        assert "result" in await host.answer_of(1)
        assert [r.ok for r in broker.take_records("client-cell")] == [True]
    assert broker.refused == 0
