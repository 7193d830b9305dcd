"""The agent's rpc relay over its real socketpair, with the test as the kernel: requests become
frames carrying only their own fields, anything else a kernel writes is dropped, an oversized line
is answered ``too_large``, a burst past the requests waiting for the host is refused ``busy`` by the
relay itself (the host's link carries at most that many), answers for a kernel that stops reading
are bounded, and the kernel's exit closes the relay."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from kernelbridge import frames
from kernelbridge.inside.agent import rpc_relay
from kernelbridge.inside.agent.rpc_relay import RpcRelay

BOUND = 10.0


@dataclass
class Wired:
    relay: RpcRelay
    kernel: socket.socket
    sent: list[frames.Frame] = field(default_factory=list)
    logs: list[tuple[str, str]] = field(default_factory=list)

    def kernel_writes(self, data: bytes) -> None:
        """The kernel writes ``data`` (from a thread: it may be more than the socket holds) while
        the relay reads it."""
        writer = threading.Thread(target=self.kernel.sendall, args=(data,))
        writer.start()
        while writer.is_alive() or select.select([self.relay.fd], [], [], 0.2)[0]:
            if select.select([self.relay.fd], [], [], 0.2)[0]:
                self.relay.on_readable()
        writer.join(BOUND)

    def kernel_reads(self) -> list[frames.Frame]:
        data = b""
        while self.relay.wants_write or select.select([self.kernel], [], [], 0.2)[0]:
            self.relay.on_writable()
            chunk = self.kernel.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def wired() -> Iterator[Wired]:
    sent: list[frames.Frame] = []
    logs: list[tuple[str, str]] = []
    relay = RpcRelay(sent.append, lambda message, level: logs.append((message, level)))
    kernel = socket.socket(fileno=socket.dup(relay.kernel_fd))  # what the kernel inherits
    relay.kernel_started()
    yield Wired(relay, kernel, sent, logs)
    relay.close()
    kernel.close()


def test_the_environment_names_the_kernels_fd() -> None:
    relay = RpcRelay(lambda frame: None, lambda message, level: None)
    try:
        assert rpc_relay.kernel_env(relay) == {"KERNELBRIDGE_RPC_FD": str(relay.kernel_fd)}
    finally:
        relay.close()


def test_a_request_becomes_a_frame_with_only_its_own_fields(wired: Wired) -> None:
    request = {"type": "rpc_request", "id": 7, "method": "call_tool", "params": {"a": 1}, "cell": "c1"}
    wired.kernel_writes(frames.encode({**request, "extra": "dropped", "agent_hash": "forged"}))
    assert wired.sent == [request]


def test_lines_that_are_not_requests_never_reach_the_host(wired: Wired) -> None:
    wired.kernel_writes(
        frames.encode({"type": "ready", "agent_hash": "forged"})
        + frames.encode({"type": "rpc_request", "id": True})
        + frames.encode({"type": "rpc_request", "id": 2**53})
        + b"not json\n"
    )
    assert wired.sent == []
    assert len(wired.logs) == 4 and all(level == "warning" for _, level in wired.logs)


def test_an_oversized_request_is_answered_too_large(wired: Wired) -> None:
    head = b'{"type":"rpc_request","id":42,"params":"'
    wired.kernel_writes(head + b"x" * (frames.MAX_RPC_BYTES + 10) + b'"}\n')
    (answer,) = wired.kernel_reads()
    assert answer["id"] == 42 and answer["error"]["kind"] == "too_large"
    assert wired.sent == []


def request(request_id: int) -> bytes:
    return frames.encode({"type": "rpc_request", "id": request_id, "method": "call_tool", "params": {}})


def test_a_burst_past_the_waiting_bound_is_refused_busy_without_reaching_the_host(wired: Wired) -> None:
    burst = 10 * rpc_relay.MAX_WAITING
    wired.kernel_writes(b"".join(request(i) for i in range(1, burst + 1)))
    assert [frame["id"] for frame in wired.sent] == list(range(1, rpc_relay.MAX_WAITING + 1))
    answers = wired.kernel_reads()
    assert [a["id"] for a in answers] == list(range(rpc_relay.MAX_WAITING + 1, burst + 1))
    assert {a["error"]["kind"] for a in answers} == {"busy"}
    assert wired.logs == []  # a flood is not a log flood
    # The host's answers free the places: the next request goes to the host again.
    wired.relay.deliver({"type": "rpc_response", "id": 1, "result": None})
    wired.kernel_writes(request(burst + 1))
    assert wired.sent[-1]["id"] == burst + 1
    assert [a["id"] for a in wired.kernel_reads()] == [1]


def test_a_request_whose_id_is_waiting_is_refused_and_the_first_still_waits(wired: Wired) -> None:
    wired.kernel_writes(request(5) + request(5))
    assert [frame["id"] for frame in wired.sent] == [5]
    (refusal,) = wired.kernel_reads()
    assert refusal["id"] == 5 and refusal["error"]["kind"] == "invalid_params"
    assert list(wired.relay.waiting) == [5]
    assert wired.relay.fail_waiting("gone") == 1


def test_answers_for_a_kernel_that_does_not_read_are_bounded(wired: Wired) -> None:
    answer = {"type": "rpc_response", "id": 1, "result": "r" * (frames.MAX_RPC_BYTES - 100)}
    for _ in range(3):
        wired.relay.deliver(answer)
    assert wired.relay.wants_write
    assert ("the kernel is not reading its rpc answers; dropped one", "warning") in wired.logs
    received: list[frames.Frame] = []
    decoder = frames.FrameDecoder(max_frame_bytes=frames.MAX_RPC_BYTES)
    while wired.relay.wants_write or select.select([wired.kernel], [], [], 0.2)[0]:
        wired.relay.on_writable()
        if select.select([wired.kernel], [], [], 0.2)[0]:
            received += [item for item in decoder.feed(wired.kernel.recv(1 << 22)) if isinstance(item, dict)]
    assert len(received) == 2  # the two that fit in MAX_PENDING_BYTES


def test_the_kernels_exit_closes_the_relay(wired: Wired) -> None:
    wired.kernel.close()
    assert select.select([wired.relay.fd], [], [], BOUND)[0]
    wired.relay.on_readable()
    assert wired.relay.closed
    wired.relay.deliver({"type": "rpc_response", "id": 1, "result": None})  # dropped quietly
    assert not wired.relay.wants_write
