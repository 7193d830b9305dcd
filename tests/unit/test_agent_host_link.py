"""The agent's host link over real pipes: the hello, framing in and out, the non-blocking outbox
and its backlog, the host leaving (stdin EOF, a broken stdout), clipped kernel frames and the log
rate limit."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernelbridge import frames
from kernelbridge.inside.agent import hello as hello_module
from kernelbridge.inside.agent import host_link
from kernelbridge.inside.agent.hello import Hello, Refusal
from kernelbridge.inside.agent.host_link import HIGH_WATER, HostLink, LinkState

BOUND = 10.0  # seconds: every wait for the other end of a pipe is bounded by this


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Host:
    """The host's ends of the two pipes."""

    to_agent: int
    from_agent: int
    decoder: frames.FrameDecoder
    open_fds: set[int]

    def close(self, fd: int) -> None:
        os.close(fd)
        self.open_fds.discard(fd)

    def write(self, *items: frames.Frame | bytes) -> None:
        data = b"".join(item if isinstance(item, bytes) else frames.encode(item) for item in items)
        os.write(self.to_agent, data)

    def read_frames(self, link: HostLink | None = None) -> list[frames.Frame]:
        """Everything the agent has written by now (flushing ``link`` while reading)."""
        got: list[frames.Frame] = []
        while True:
            if link is not None:
                link.flush()
            if not select.select([self.from_agent], [], [], 0)[0]:
                if link is None or not link.wants_write:
                    return got
                continue
            chunk = os.read(self.from_agent, 1 << 20)
            if not chunk:
                return got
            for item in self.decoder.feed(chunk):
                assert not isinstance(item, frames.FrameError), item
                got.append(item)


Pipes = tuple[Host, HostLink, FakeClock]


Ready = tuple[list[int], list[int], list[int]]


class SimulatedWaits:
    """The host link's waits without waiting: ``select`` answers with what is ready now, and when
    nothing is, the whole timeout passes at once on a simulated monotonic clock. ``waited`` lists
    the timeouts that passed. The deadlines of the hello and the drain use that clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waited: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def select(self, rlist: list[int], wlist: list[int], xlist: list[int], timeout: float) -> Ready:
        ready = select.select(rlist, wlist, xlist, 0)
        if not any(ready):
            self.waited.append(round(timeout, 6))
            self.now += timeout
        return ready


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> SimulatedWaits:
    simulated = SimulatedWaits()
    monkeypatch.setattr(host_link, "select", simulated)
    monkeypatch.setattr(host_link, "time", simulated)
    return simulated


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    agent_in, host_out = os.pipe()
    host_in, agent_out = os.pipe()
    clock = FakeClock()
    link = HostLink(agent_in, agent_out, clock=clock)
    open_fds = {agent_in, host_out, host_in, agent_out}
    yield Host(host_out, host_in, frames.FrameDecoder(), open_fds), link, clock
    for fd in open_fds:
        os.close(fd)


def hello(**fields: object) -> frames.Frame:
    return {"type": frames.HELLO, "key": "k3y", "session": "s", **fields}


def kernel_frame(text: str) -> frames.Frame:
    msg = {"header": {"msg_type": "stream"}, "parent_header": {}, "metadata": {}, "content": {"text": text}}
    return frames.kernel_frame("iopub", msg)


def test_the_hello_is_accepted_and_the_frames_behind_it_stay_queued(pipes: Pipes) -> None:
    host, link, _ = pipes
    assert link.state is LinkState.AWAITING_HELLO
    host.write(hello(), {"type": frames.INTERRUPT}, {"type": frames.SHUTDOWN})
    assert link.accept_hello(timeout=BOUND) == Hello(key=b"k3y")
    assert link.state is LinkState.ATTACHED
    assert [link.receive(), link.receive(), link.receive()] == [
        {"type": frames.INTERRUPT},
        {"type": frames.SHUTDOWN},
        None,
    ]
    assert "attached" in repr(link)


def test_a_first_frame_that_is_not_hello_is_refused(pipes: Pipes) -> None:
    host, link, _ = pipes
    host.write({"type": frames.SHUTDOWN})
    refusal = link.accept_hello(timeout=BOUND)
    assert refusal == Refusal(
        2, frames.EXIT_START_FAILED, "the host's first frame on stdin was 'shutdown', not hello"
    )


def test_no_hello_in_time_is_refused_after_the_timeout(pipes: Pipes, waits: SimulatedWaits) -> None:
    _, link, _ = pipes
    refusal = link.accept_hello(timeout=0.2)
    assert refusal == Refusal(2, frames.EXIT_START_FAILED, "no hello frame on stdin within 0.2 s")
    assert waits.waited == [0.2]  # the whole timeout, for the hello
    assert link.state is LinkState.AWAITING_HELLO


def test_eof_before_the_hello_is_refused_at_once(pipes: Pipes, waits: SimulatedWaits) -> None:
    host, link, _ = pipes
    host.close(host.to_agent)
    refusal = link.accept_hello(timeout=BOUND)
    said = "the host closed stdin before sending its hello frame"
    assert refusal == Refusal(2, frames.EXIT_START_FAILED, said)
    assert waits.waited == []  # stdin was readable (its EOF) at once: no wait for the timeout
    assert link.state is LinkState.ENDED


def test_a_host_expecting_another_agent_is_refused(
    pipes: Pipes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, link, _ = pipes
    baked = tmp_path / "AGENT_HASH"
    baked.write_text("ab" * 32 + "\n")
    monkeypatch.setattr(hello_module, "AGENT_HASH_FILE", baked)
    assert hello_module.check_agent_hash("ab" * 32) is None
    assert hello_module.check_agent_hash(None) is None  # a host that expects nothing in particular
    host.write(hello(agent_hash="cd" * 32))
    refusal = link.accept_hello(timeout=BOUND)
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.kind) == (3, frames.EXIT_AGENT_MISMATCH)
    assert "abababababab" in refusal.reason and "cdcdcdcdcdcd" in refusal.reason
    assert "kernelbridge image build" in refusal.reason


def test_eof_ends_the_link_after_the_frames_already_queued(pipes: Pipes) -> None:
    host, link, _ = pipes
    host.write(hello())
    assert isinstance(link.accept_hello(timeout=BOUND), Hello)
    with link.polled():
        host.write({"type": frames.SHUTDOWN})
        host.close(host.to_agent)
        while link.wants_read:
            select.select([link.input_fd], [], [], BOUND)
            link.read()
        assert link.ended
        assert link.receive() == {"type": frames.SHUTDOWN}  # still relayed: it came before the EOF
        assert link.receive() is None
        # Output still goes out after stdin's EOF: the host may read stdout to its end.
        link.send_exit(0, frames.EXIT_SHUTDOWN, "shutdown requested")
        assert host.read_frames(link)[-1]["type"] == frames.EXIT


def test_malformed_host_frames_are_logged_and_dropped(pipes: Pipes) -> None:
    host, link, _ = pipes
    host.write(hello())
    assert isinstance(link.accept_hello(timeout=BOUND), Hello)
    with link.polled():
        host.write(b"\x00not json\n", b'{"type": "nope"}\n', {"type": frames.INTERRUPT})
        select.select([link.input_fd], [], [], BOUND)
        link.read()
        assert link.receive() == {"type": frames.INTERRUPT}
        logs = host.read_frames(link)
    assert [frame["type"] for frame in logs] == [frames.LOG, frames.LOG]
    assert all(frame["message"].startswith("dropped host frame:") for frame in logs)
    assert all(frame["level"] == "warning" for frame in logs)


def test_a_second_hello_never_reaches_the_relay(pipes: Pipes) -> None:
    host, link, _ = pipes
    host.write(hello(), hello(key="other"), {"type": frames.INTERRUPT})
    assert link.accept_hello(timeout=BOUND) == Hello(key=b"k3y")
    assert link.receive() == {"type": frames.INTERRUPT}
    assert host.read_frames() == [{"type": frames.LOG, "level": "debug", "message": "ignored hello frame"}]


def test_polled_sends_never_block_and_a_backlog_pauses_the_kernel(pipes: Pipes) -> None:
    host, link, _ = pipes
    text = "x" * (1 << 20)
    count = HIGH_WATER // len(text) + 2
    with link.polled():
        for n in range(count):  # far more than a pipe holds: each send returns at once
            link.send(kernel_frame(f"{n}:{text}"))
        assert link.wants_write and link.backlogged
        received = host.read_frames(link)
        assert not link.wants_write and not link.backlogged
    assert [frame["msg"]["content"]["text"] for frame in received] == [f"{n}:{text}" for n in range(count)]


def test_sends_outside_the_loop_wait_until_written(pipes: Pipes) -> None:
    host, link, _ = pipes
    received: list[frames.Frame] = []
    reader = threading.Thread(target=lambda: received.extend(_read_until_exit(host)))
    reader.start()
    link.send(kernel_frame("y" * (4 << 20)))  # more than a pipe holds: returns once it is all out
    assert not link.wants_write
    link.send_exit(1, frames.EXIT_KERNEL_DIED, "gone")
    reader.join(BOUND)
    assert [frame["type"] for frame in received] == [frames.KERNEL, frames.EXIT]


def test_draining_for_a_host_that_does_not_read_is_bounded(pipes: Pipes, waits: SimulatedWaits) -> None:
    _, link, _ = pipes
    with link.polled():
        link.send(kernel_frame("z" * (1 << 20)))
    assert link.drain(0.2) is False
    assert waits.waited == [0.2]  # stdout stayed full for the whole timeout, then it gave up
    assert link.wants_write  # what was queued is still queued


def test_a_broken_stdout_ends_the_link_without_raising(pipes: Pipes) -> None:
    host, link, _ = pipes
    host.write(hello(), {"type": frames.INTERRUPT})
    assert isinstance(link.accept_hello(timeout=BOUND), Hello)
    host.close(host.from_agent)
    with link.polled():
        link.send(kernel_frame("after the host left"))
        link.flush()  # the relay's turn writes what it queued
        assert link.ended
        assert link.receive() is None  # nobody would hear the answers
        link.send(kernel_frame("and again"))  # nothing is tried any more
        assert not link.wants_write and link.drain(BOUND)


def test_a_kernel_frame_over_the_cap_is_sent_clipped(pipes: Pipes) -> None:
    host, link, _ = pipes
    huge = kernel_frame("e" * (frames.MAX_FRAME_BYTES + 10))
    huge["buffers"] = ["AAAA"]
    with link.polled():
        link.send(huge)
        (frame,) = host.read_frames(link)
    text = frame["msg"]["content"]["text"]
    assert text.startswith("e" * host_link.CLIP_STRING)
    assert text.endswith(
        f"... [{frames.MAX_FRAME_BYTES + 10 - host_link.CLIP_STRING:,} characters cut by kernelbridge]"
    )
    assert "buffers" not in frame


def test_a_kernel_frame_still_over_the_cap_when_clipped_is_dropped_with_a_warning(pipes: Pipes) -> None:
    host, link, _ = pipes
    parts = frames.MAX_FRAME_BYTES // host_link.CLIP_STRING + 2
    msg = {
        "header": {},
        "parent_header": {},
        "metadata": {},
        "content": {"data": ["d" * host_link.CLIP_STRING] * parts},
    }
    with link.polled():
        link.send(frames.kernel_frame("iopub", msg))
        (frame,) = host.read_frames(link)
    assert frame["type"] == frames.LOG and frame["level"] == "warning"
    assert "over the frame cap" in frame["message"]


def test_log_lines_are_capped_and_rate_limited(pipes: Pipes) -> None:
    host, link, clock = pipes
    with link.polled():
        link.log("w" * 5000, "kernel")
        for n in range(host_link.LOG_BURST + 49):
            link.log(f"line {n}", "kernel")
        first = host.read_frames(link)
        clock.now += host_link.LOG_WINDOW + 1
        link.log("after the window")
        second = host.read_frames(link)
    assert len(first) == host_link.LOG_BURST
    assert first[0]["message"] == "w" * host_link.MAX_LOG_LINE and first[0]["level"] == "kernel"
    assert [frame["message"] for frame in second] == ["50 log lines suppressed", "after the window"]


def _read_until_exit(host: Host) -> Iterator[frames.Frame]:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if not select.select([host.from_agent], [], [], 0.1)[0]:
            continue
        for item in host.decoder.feed(os.read(host.from_agent, 1 << 20)):
            assert not isinstance(item, frames.FrameError)
            yield item
            if item["type"] == frames.EXIT:
                return
