"""Pieces of the agent's poll loop that work without a kernel: a start that never gets a valid
hello ends with the right ``exit`` frame and status, and the poll set follows what each source
wants. The PID-1 reaper on real zombies is tests/process/test_agent_init.py; the loop with a real
kernel is tests/integration/test_tunnel.py (locally) and the sandbox tests (in a container)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import zmq

from kernelbridge import frames
from kernelbridge.inside.agent import relay as relay_module
from kernelbridge.inside.agent.host_link import HostLink
from kernelbridge.inside.agent.relay import Phase, PollSet, Relay

BOUND = 10.0


@pytest.fixture
def pipes() -> Iterator[tuple[int, int, HostLink]]:
    agent_in, host_out = os.pipe()
    host_in, agent_out = os.pipe()
    yield host_out, host_in, HostLink(agent_in, agent_out)
    for fd in (agent_in, host_out, host_in, agent_out):
        os.close(fd)


def exit_frame(host_in: int) -> frames.Frame:
    (frame,) = [item for item in frames.FrameDecoder().feed(os.read(host_in, 1 << 20))]
    assert isinstance(frame, dict) and frame["type"] == frames.EXIT
    return frame


def test_a_stale_agent_exits_3_with_agent_mismatch(pipes: tuple[int, int, HostLink]) -> None:
    host_out, host_in, link = pipes
    os.write(host_out, frames.encode({"type": frames.HELLO, "key": "k", "agent_hash": "f" * 64}))
    relay = Relay(link)
    assert relay.run() == 3
    assert relay.phase is Phase.FINISHED
    frame = exit_frame(host_in)
    assert (frame["status"], frame["kind"]) == (3, frames.EXIT_AGENT_MISMATCH)


def test_a_host_that_leaves_before_its_hello_gets_start_failed(pipes: tuple[int, int, HostLink]) -> None:
    host_out, host_in, link = pipes
    os.write(host_out, b"garbage\n")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, host_out)  # the host's end of stdin closes (the fixture closes /dev/null)
    os.close(devnull)
    relay = Relay(link)
    assert relay.run() == 2
    frames_out = list(frames.FrameDecoder().feed(os.read(host_in, 1 << 20)))
    assert [frame["type"] for frame in frames_out if isinstance(frame, dict)] == [frames.LOG, frames.EXIT]
    exit_frame = frames_out[-1]
    assert isinstance(exit_frame, dict) and exit_frame["kind"] == frames.EXIT_START_FAILED
    # Its EOF, not the hello's timeout, ended the wait.
    assert exit_frame["reason"] == "the host closed stdin before sending its hello frame", exit_frame


def test_the_poll_set_follows_what_each_source_wants() -> None:
    read_end, write_end = os.pipe()
    try:
        polls = PollSet()
        os.write(write_end, b"x")
        polls.want(read_end, zmq.POLLIN)
        assert polls.poll(0) == [(read_end, zmq.POLLIN)]
        polls.want(read_end, 0)  # readable, but not wanted now (a backlogged host)
        assert polls.poll(0) == [] and polls.wanted(read_end) == 0
        polls.want(read_end, 0)  # idempotent
        polls.want(write_end, zmq.POLLOUT)
        polls.want(read_end, zmq.POLLIN)
        assert sorted(polls.poll(0)) == sorted([(read_end, zmq.POLLIN), (write_end, zmq.POLLOUT)])
    finally:
        os.close(read_end)
        os.close(write_end)


class QueuedKernel:
    """What the relay reads of a kernel: a ZMQ socket whose messages are already waiting."""

    def __init__(self) -> None:
        self.client = self

    def receive(self, sock: zmq.Socket[bytes]) -> tuple[str, dict[str, object], list[bytes]]:
        return "iopub", sock.recv_json(), []  # type: ignore[return-value]


def test_a_burst_of_kernel_messages_goes_to_the_host_in_one_write(
    pipes: tuple[int, int, HostLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, host_in, link = pipes
    context = zmq.Context()
    kernel_side, agent_side = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    kernel_side.bind("inproc://burst")
    agent_side.connect("inproc://burst")
    writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(fd) or real_write(fd, data))
    try:
        count = relay_module.DRAIN_MESSAGES + 6
        for i in range(count):
            kernel_side.send_json({"header": {"msg_type": "stream"}, "content": {"text": str(i)}})
        assert agent_side.poll(int(BOUND * 1000))
        relay = Relay(link)
        with link.polled():
            relay._relay_kernel_messages(QueuedKernel(), agent_side)  # type: ignore[arg-type]
            assert writes == [], "queued for the end of the turn"
            link.flush()
        got = list(frames.FrameDecoder().feed(os.read(host_in, 1 << 20)))
        assert writes == [link.output_fd], "one write for the whole burst"
        texts = [f["msg"]["content"]["text"] for f in got if isinstance(f, dict)]
        assert texts == [str(i) for i in range(relay_module.DRAIN_MESSAGES)], "at most DRAIN_MESSAGES a turn"
    finally:
        kernel_side.close(linger=0)
        agent_side.close(linger=0)
        context.term()
