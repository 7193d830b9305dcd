"""The agent's client of one kernel: ZMQ sockets on the container's loopback, and the proof that
iopub delivers.

DEALER sockets for shell, control and stdin share one identity, a SUB reads iopub, every socket has
LINGER 0. Messages to the kernel are signed with its key; messages from it are not verified (one
trust domain). :meth:`KernelClient.wait_until_iopub_delivers` returns once iopub is known to deliver
(the slow-joiner proof); the host never sees its handshake. Depends on pyzmq and
``kernelbridge.frames`` only. Why: docs/design/sandbox.md.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import zmq

from kernelbridge import frames

# Why 60 s: ipykernel 7 is ready in ~0.25 s, but 20 kernels started at once on 2 cores take
# ~12 s; a kernel that needs longer than this is broken, not slow.
KERNEL_READY_TIMEOUT = 60.0
# Re-ask every 0.05 s: an iopub SUB that joins late misses the status of the first requests, and
# each retry interval is paid in full by every cold start. kernel_info is cheap to answer.
KERNEL_INFO_RETRY = 0.05
HANDSHAKE_DRAIN = 0.05
"""How long the answers to the remaining handshake requests are read and discarded."""
HOST_CHANNELS = ("shell", "control", "stdin")
"""The channels the host may send on (iopub is the kernel's only)."""

Log = Callable[[str, str], None]
Received = tuple[str, dict[str, Any], list[bytes]]
"""A kernel message: its channel, the message, its buffers."""


class KernelNotReading(Exception):
    """The kernel has not read the messages already queued on a channel (ZMQ's high-water mark,
    1,000 messages): this one is refused rather than waited on. A blocking send would stop the
    agent (one thread) for as long as the kernel does not read: its other channels, the host's
    interrupts, and the ready wait's own deadline (an ipykernel that failed to bind its iopub or
    heartbeat port stays alive and never reads)."""


class KernelClient:
    """The agent's sockets to one kernel, connected to the ports of ``connection`` (a connection
    file's content). ``identity`` is the shell/stdin identity; ``log`` reports malformed messages."""

    def __init__(
        self, context: zmq.Context[Any], connection: Mapping[str, Any], key: bytes, identity: str, log: Log
    ) -> None:
        self._key = key
        self._identity = identity
        self._log = log
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        for channel in HOST_CHANNELS:
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{connection[f'{channel}_port']}")
            self._sockets[channel] = sock
        iopub = context.socket(zmq.SUB)
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        iopub.setsockopt(zmq.LINGER, 0)
        iopub.connect(f"tcp://127.0.0.1:{connection['iopub_port']}")
        self._sockets["iopub"] = iopub
        self._channel_of = {sock: channel for channel, sock in self._sockets.items()}

    @property
    def sockets(self) -> Iterable[zmq.Socket[bytes]]:
        """Every socket, to poll for reading: shell, control, stdin, iopub."""
        return self._sockets.values()

    def send(self, channel: str, msg: dict[str, Any], buffers: list[bytes] | None = None) -> str:
        """Sign and send ``msg`` on ``channel`` (one of HOST_CHANNELS); returns its msg_id.
        Raises TypeError/ValueError if the message cannot be serialized, KeyError for a channel
        without a socket, KernelNotReading when the channel's queue is full (never blocks)."""
        wire = frames.to_wire(msg, buffers or [], self._key)
        try:  # a full queue refuses the first part only: the rest of a message always follows it
            self._sockets[channel].send_multipart(wire, flags=zmq.DONTWAIT, copy=False)
        except zmq.Again:
            raise KernelNotReading(f"the kernel has not read its {channel} channel's queue") from None
        return str(msg["header"].get("msg_id", ""))

    def receive(self, sock: zmq.Socket[bytes]) -> Received | None:
        """The next message of ``sock`` (readable), or None (logged) if it is malformed."""
        try:
            wire = frames.from_wire(sock.recv_multipart())
        except ValueError as exc:
            self._log(f"dropped a malformed kernel message: {exc}", "warning")
            return None
        return self._channel_of[sock], wire.msg, wire.buffers

    def wait_until_iopub_delivers(
        self, alive: Callable[[], bool], timeout: float = KERNEL_READY_TIMEOUT
    ) -> dict[str, Any] | None:
        """Send kernel_info_request until both its reply and an iopub message answering one of
        them arrive. Returns the kernel_info reply content, or None if the kernel died (``alive``
        said so) or did not answer within ``timeout``."""
        shell, iopub = self._sockets["shell"], self._sockets["iopub"]
        poller = zmq.Poller()
        poller.register(shell, zmq.POLLIN)
        poller.register(iopub, zmq.POLLIN)
        sent: set[str] = set()
        reply: dict[str, Any] | None = None
        iopub_seen = False
        deadline = time.monotonic() + timeout
        next_send = 0.0
        while time.monotonic() < deadline:
            if not alive():
                return None
            if time.monotonic() >= next_send and not iopub_seen:
                try:
                    sent.add(self.send("shell", _new_message("kernel_info_request", self._identity)))
                except KernelNotReading:
                    pass  # a thousand asked and none read: the deadline, or `alive`, ends this
                next_send = time.monotonic() + KERNEL_INFO_RETRY
            for sock, _ in poller.poll(50):
                received = self.receive(sock)
                if received is None:
                    continue
                channel, msg, _buffers = received
                if msg.get("parent_header", {}).get("msg_id") not in sent:
                    continue
                if channel == "iopub":
                    iopub_seen = True
                elif msg["header"].get("msg_type") == "kernel_info_reply":
                    reply = msg["content"]
            if iopub_seen and reply is not None:
                self._discard_answers(poller)
                return reply
        return None

    def _discard_answers(self, poller: zmq.Poller) -> None:
        """Read and drop the remaining answers to the handshake so they do not reach the host."""
        end = time.monotonic() + HANDSHAKE_DRAIN
        while time.monotonic() < end:
            for sock, _ in poller.poll(10):
                self.receive(sock)

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
        self._channel_of.clear()


def kernel_versions(kernel_info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``versions`` of a ``ready`` frame, from a kernel_info reply's content."""
    return {
        "python": sys.version.split()[0],
        "ipykernel": _package_version("ipykernel"),
        "ipython": kernel_info.get("implementation_version"),
        "protocol": kernel_info.get("protocol_version"),
    }


def _new_message(msg_type: str, session: str) -> dict[str, Any]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": "kernelbridge",
        "session": session,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        "version": "5.3",
    }
    return {"header": header, "parent_header": {}, "metadata": {}, "content": {}}


def _package_version(name: str) -> str | None:
    # Imported here, not at the top: about 25 ms of imports (measured), not needed before a kernel runs.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
