"""The agent's kernel client against a stub kernel on real ZMQ sockets (ROUTER shell and stdin, PUB
iopub): the slow-joiner proof waits for iopub, not just the reply; a dead or silent kernel ends the
wait; shell and stdin share one identity; malformed kernel messages are dropped with a log line; a
kernel that never reads gets its sends refused, never waited on."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import zmq

from kernelbridge import frames
from kernelbridge.inside.agent.host_link import HostLink
from kernelbridge.inside.agent.kernel_client import KernelClient, KernelNotReading
from kernelbridge.inside.agent.relay import Kernel, Relay

KEY = b"k3y"
BOUND = 10.0


@dataclass
class StubKernel:
    """Answers kernel_info_request on shell; publishes its iopub status only from request number
    ``iopub_from`` on (the earlier ones are "lost to a slow joiner"), or never (None)."""

    iopub_from: int | None = 1
    garbage_first: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    identities: dict[str, bytes] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    stdin_heard: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)

    def serve(self, context: zmq.Context[Any], ready: threading.Event) -> None:
        shell, stdin, control = (context.socket(zmq.ROUTER) for _ in range(3))
        iopub = context.socket(zmq.PUB)
        for name, sock in {"shell": shell, "stdin": stdin, "control": control, "iopub": iopub}.items():
            sock.setsockopt(zmq.LINGER, 0)
            self.ports[f"{name}_port"] = sock.bind_to_random_port("tcp://127.0.0.1")
        ready.set()
        poller = zmq.Poller()
        poller.register(shell, zmq.POLLIN)
        poller.register(stdin, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(20):
                    parts = sock.recv_multipart()
                    wire = frames.from_wire(parts)
                    channel = "shell" if sock is shell else "stdin"
                    self.identities[channel] = wire.idents[0]
                    if channel == "stdin":
                        self.stdin_heard.set()
                        continue
                    self.requests.append(wire.msg)
                    if self.garbage_first and len(self.requests) == 1:
                        shell.send_multipart([*wire.idents, b"not a jupyter message"])
                    if self.iopub_from is not None and len(self.requests) >= self.iopub_from:
                        status = _message("status", wire.msg, {"execution_state": "idle"})
                        iopub.send_multipart(frames.to_wire(status, [], KEY))
                    reply = _message("kernel_info_reply", wire.msg, {"implementation_version": "9.9"})
                    shell.send_multipart([*wire.idents, *frames.to_wire(reply, [], KEY)])
        finally:
            for sock in (shell, stdin, control, iopub):
                sock.close(linger=0)


@dataclass
class Running:
    stub: StubKernel
    client: KernelClient
    logs: list[tuple[str, str]]


@pytest.fixture
def start() -> Iterator[Any]:
    context: zmq.Context[Any] = zmq.Context()
    started: list[tuple[StubKernel, threading.Thread, KernelClient]] = []

    def start_stub(**options: Any) -> Running:
        stub = StubKernel(**options)
        ready = threading.Event()
        thread = threading.Thread(target=stub.serve, args=(context, ready), daemon=True)
        thread.start()
        assert ready.wait(BOUND)
        logs: list[tuple[str, str]] = []
        client = KernelClient(
            context, stub.ports, KEY, "agent-identity", lambda m, level: logs.append((m, level))
        )
        started.append((stub, thread, client))
        return Running(stub, client, logs)

    yield start_stub
    for stub, thread, client in started:
        client.close()
        stub._stop.set()
        thread.join(BOUND)
    context.term()


def test_ready_waits_until_iopub_delivers_not_only_for_the_reply(start: Any) -> None:
    running = start(iopub_from=4)
    reply = running.client.wait_until_iopub_delivers(alive=lambda: True, timeout=BOUND)
    assert reply == {"implementation_version": "9.9"}
    # Replies came from the first request on; ready had to wait for the fourth's iopub status.
    assert len(running.stub.requests) >= 4
    assert {msg["header"]["msg_type"] for msg in running.stub.requests} == {"kernel_info_request"}


def test_a_kernel_whose_iopub_never_delivers_is_not_ready(start: Any) -> None:
    running = start(iopub_from=None)
    assert running.client.wait_until_iopub_delivers(alive=lambda: True, timeout=0.5) is None
    assert len(running.stub.requests) > 1  # it kept asking


def test_a_dead_kernel_ends_the_wait_at_once(start: Any) -> None:
    running = start()
    asked: list[bool] = []

    def dead() -> bool:
        asked.append(False)
        return False

    assert running.client.wait_until_iopub_delivers(alive=dead, timeout=BOUND) is None
    assert asked == [False]  # the first check ended it: no request, no wait


def test_a_malformed_kernel_message_is_logged_and_the_wait_goes_on(start: Any) -> None:
    running = start(garbage_first=True, iopub_from=2)
    assert running.client.wait_until_iopub_delivers(alive=lambda: True, timeout=BOUND) is not None
    assert ("dropped a malformed kernel message: no <IDS|MSG> delimiter", "warning") in running.logs


def test_shell_and_stdin_share_one_identity(start: Any) -> None:
    running = start()
    assert running.client.wait_until_iopub_delivers(alive=lambda: True, timeout=BOUND) is not None
    running.client.send("stdin", _message("input_reply", {"header": {}}, {"value": "x"}))
    assert running.stub.stdin_heard.wait(BOUND)
    assert running.stub.identities == {"shell": b"agent-identity", "stdin": b"agent-identity"}


@pytest.fixture
def deaf() -> Iterator[KernelClient]:
    """A client of a kernel that never reads: its ports are held by plain TCP listeners, which take
    the connections and never speak ZMQ (an ipykernel that failed to bind its iopub or heartbeat
    port stays alive this way), so what is sent stays queued."""
    context: zmq.Context[Any] = zmq.Context()
    holders: list[socket.socket] = []
    ports = {}
    for channel in ("shell", "control", "stdin", "iopub"):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        holders.append(holder)
        ports[f"{channel}_port"] = holder.getsockname()[1]
    client = KernelClient(context, ports, KEY, "agent-identity", lambda message, level: None)
    try:
        yield client
    finally:
        client.close()
        context.term()
        for holder in holders:
            holder.close()


def _fill(client: KernelClient) -> int:
    """Send on shell until its queue refuses; how many sends that took."""
    for sent in range(1, 20_000):
        try:
            client.send("shell", _message("kernel_info_request", {}, {}))
        except KernelNotReading:
            return sent
    raise AssertionError("20,000 messages queued for a kernel that reads none")


# Without the refusal the send past the queue's mark blocks for good: these fail at their timeout.
@pytest.mark.timeout(60)
def test_a_kernel_that_never_reads_gets_its_sends_refused_not_waited_on(deaf: KernelClient) -> None:
    assert _fill(deaf) > 1000  # ZMQ's high-water mark queued first
    with pytest.raises(KernelNotReading, match="the kernel has not read its shell channel's queue"):
        deaf.send("shell", _message("execute_request", {}, {"code": "1+1"}))
    assert deaf.send("control", _message("interrupt_request", {}, {}))  # each channel its own queue


@pytest.mark.timeout(60)
def test_a_kernel_that_never_reads_cannot_hold_the_ready_wait_past_its_deadline(deaf: KernelClient) -> None:
    _fill(deaf)
    assert deaf.wait_until_iopub_delivers(alive=lambda: True, timeout=0.3) is None


@pytest.mark.timeout(60)
def test_the_relay_drops_a_host_frame_the_kernel_cannot_take_and_says_so(deaf: KernelClient) -> None:
    agent_in, host_out = os.pipe()
    host_in, agent_out = os.pipe()
    relay = Relay(HostLink(agent_in, agent_out))
    try:
        # Only the client is used on a kernel frame's way (a real kernel: test_agent_boot.py).
        relay._kernel = Kernel(process=None, client=deaf, rpc=None, rpc_fd=-1)  # type: ignore[arg-type]
        _fill(deaf)
        message = _message("execute_request", {}, {"code": "1+1"})
        relay._on_host_frame({"type": frames.KERNEL, "channel": "shell", "msg": message})
        relay.link.flush()
        said = [f for f in frames.FrameDecoder().feed(os.read(host_in, 1 << 16)) if isinstance(f, dict)]
    finally:
        relay._kernel = None
        relay._context.term()
        for fd in (agent_in, host_out, host_in, agent_out):
            os.close(fd)
    assert [(f["type"], f["level"], f["message"]) for f in said] == [
        (frames.LOG, "warning", "dropped kernel frame: the kernel has not read its shell channel's queue")
    ]


def _message(msg_type: str, parent: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    header = {"msg_id": f"{msg_type}-{time.monotonic_ns()}", "msg_type": msg_type, "session": "stub"}
    return {"header": header, "parent_header": parent.get("header", {}), "metadata": {}, "content": content}
