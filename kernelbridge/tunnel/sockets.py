"""The Jupyter side of a tunnel: the five kernel sockets any Jupyter client connects to.

Bound on 127.0.0.1 at the connection file's ports. A message in must carry a valid HMAC under the
connection file's key (the host's; the kernel in the sandbox has another), and every message out is
signed with it. Bounded in bytes: a message of :data:`TRACK_BYTES` or more that would take what ZMQ
still holds past :data:`MAX_QUEUED_BYTES`, or any past a client's high-water mark, is dropped and
counted. Design: docs/design/host.md.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import zmq
import zmq.asyncio

from kernelbridge import frames
from kernelbridge.ratelimit import RateLimitedLog

log = logging.getLogger("kernelbridge.tunnel")

ROUTED_CHANNELS = ("shell", "control", "stdin")
MAX_QUEUED_BYTES = 64 * 1024 * 1024
TRACK_BYTES = 64 * 1024
"""Messages at least this big are tracked byte by byte; smaller ones are bounded by SNDHWM."""
SNDHWM = 1000
RCVHWM = 1000
WELCOME_VERSION = "5.3"
"""The protocol version in the ``iopub_welcome`` header (the bridge's own messages say the same)."""
MAX_TOPICS = 256
"""Distinct iopub subscriptions remembered; past that, every message is published (a client may
subscribe to anything, unsigned: it must not make the bridge remember without bound)."""
LOG_WINDOW = 10.0
"""Warnings about one tunnel's clients per window (bad messages, slow readers); the rest are counted."""

ClientMessage = Callable[[str, frames.WireMessage], Awaitable[None]]
"""Called with (channel, message) for each verified message from a client."""


class ClientSockets:
    """Bound kernel sockets. Use :meth:`serve` in a task group; :meth:`close` at the end."""

    def __init__(self, connection: dict[str, Any], key: bytes) -> None:
        self.connection = connection
        self.key = key
        # One context (and its I/O thread) for every tunnel of the process: a bridge with a
        # hundred sessions must not run a hundred ZMQ I/O threads.
        self.ctx = zmq.asyncio.Context.instance()
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        self._queued: collections.deque[tuple[zmq.MessageTracker, int]] = collections.deque()
        self._queued_bytes = 0
        self._topics: set[bytes] = set()
        """iopub topics somebody subscribes to (XPUB says a topic's first and last subscriber)."""
        self._topics_overflowed = False
        self._iopub_sync: zmq.Socket[bytes] | None = None
        """The iopub socket used without awaiting (the subscription events are drained at once)."""
        self._session = uuid.uuid4().hex
        """The ``session`` of the messages this side makes itself (the welcomes)."""
        self.dropped = 0
        self._refused_log = RateLimitedLog(
            log, "%d more refused client messages not logged", burst=20, window=LOG_WINDOW
        )
        self._slow_log = RateLimitedLog(
            log, "%d more slow-client warnings not logged", burst=1, window=LOG_WINDOW
        )

    def bind(self) -> None:
        """Bind every socket; a port of 0 in the connection info is replaced by a free port.
        Raises zmq.ZMQError (e.g. a port in use)."""
        ip = self.connection.get("ip", "127.0.0.1")
        kinds = {
            "shell": zmq.ROUTER,
            "control": zmq.ROUTER,
            "stdin": zmq.ROUTER,
            "iopub": zmq.XPUB,
            "hb": zmq.ROUTER,
        }
        try:
            for channel, kind in kinds.items():
                sock = self.ctx.socket(kind)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, SNDHWM)
                sock.setsockopt(zmq.RCVHWM, RCVHWM)
                if kind == zmq.XPUB:  # every subscription is heard (and welcomed), not a topic's first only
                    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
                if kind == zmq.ROUTER:
                    # Don't silently drop a reply to a client that went away and came back.
                    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
                self.sockets[channel] = sock
                if kind == zmq.XPUB:
                    self._iopub_sync = zmq.Socket.shadow(sock.underlying)
                port = int(self.connection.get(f"{channel}_port") or 0)
                if port:
                    sock.bind(f"tcp://{ip}:{port}")
                else:  # bound by ZMQ itself: no window in which another process takes the port
                    self.connection[f"{channel}_port"] = sock.bind_to_random_port(f"tcp://{ip}")
        except BaseException:
            self.close()
            raise

    async def serve(self, on_message: ClientMessage) -> None:
        """Receive from every client socket until cancelled (and echo heartbeats)."""
        async with anyio.create_task_group() as tg:
            for channel in ROUTED_CHANNELS:
                tg.start_soon(self._pump, channel, on_message)
            tg.start_soon(self._heartbeat)
            tg.start_soon(self._subscriptions)

    async def _pump(self, channel: str, on_message: ClientMessage) -> None:
        sock = self.sockets[channel]
        while True:
            parts = await sock.recv_multipart()
            try:
                wire = frames.from_wire(parts)
            except ValueError as exc:
                self._refused_log.log(
                    logging.WARNING, "dropped a malformed %s message from a client: %s", channel, exc
                )
                continue
            if not frames.verify(self.key, wire):
                self._refused_log.log(logging.WARNING, "dropped a %s message with a bad signature", channel)
                continue
            await on_message(channel, wire)

    async def _heartbeat(self) -> None:
        """Echo heartbeats (what ipykernel's Heartbeat thread does), as a task."""
        sock = self.sockets["hb"]
        while True:
            parts = await sock.recv_multipart()
            with contextlib.suppress(zmq.ZMQError):
                await sock.send_multipart(parts, flags=zmq.NOBLOCK)

    async def _subscriptions(self) -> None:
        """Follow who subscribes to iopub (``\\x01topic`` from the XPUB for every subscription,
        ``\\x00topic`` when a topic's last subscriber leaves), and greet each subscription with
        JEP 65's ``iopub_welcome``."""
        while True:
            await self.sockets["iopub"].poll()  # POLLIN, no timeout
            self._take_subscriptions()

    def _take_subscriptions(self) -> None:
        """Every subscription event ZMQ holds, without waiting (also before a publish: a client
        that has subscribed gets its welcome before anything else)."""
        sync = self._iopub_sync
        if sync is None:
            return
        # EVENTS first: a recv that finds nothing raises, which costs more than asking (this
        # runs before every iopub message the sandbox sends).
        while int(sync.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                event = sync.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            topic = event[1:]
            if event[:1] == b"\x01" and not self._topics_overflowed:
                self._topics.add(topic)
                self._topics_overflowed = len(self._topics) > MAX_TOPICS  # for good: published
                self._welcome(sync, topic)
            elif event[:1] == b"\x00":
                self._topics.discard(topic)

    def _welcome(self, sync: zmq.Socket[bytes], topic: bytes) -> None:
        content = {"subscription": topic.decode("utf-8", errors="replace")}
        header = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "iopub_welcome",
            "username": "kernel",
            "session": self._session,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            "version": WELCOME_VERSION,
        }
        msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        with contextlib.suppress(zmq.ZMQError):  # a full queue: that subscriber is not reading
            sync.send_multipart([topic, *frames.to_wire(msg, [], self.key)], zmq.NOBLOCK)

    @property
    def subscribed(self) -> bool:
        """Somebody may read iopub (a jupyter client subscribes to every topic at once)."""
        self._take_subscriptions()
        return bool(self._topics) or self._topics_overflowed

    async def publish(self, msg: dict[str, Any], buffers: list[bytes]) -> None:
        """Send an iopub message to every subscriber (none: not even serialized)."""
        if not self.subscribed:
            return
        msg_type = str(msg.get("header", {}).get("msg_type", ""))
        await self._send("iopub", [f"kernel.{msg_type}".encode()], msg, buffers)

    async def reply(
        self, channel: str, idents: list[bytes], msg: dict[str, Any], buffers: list[bytes]
    ) -> None:
        """Send a reply (or input_request) to the client identity that asked."""
        await self._send(channel, idents, msg, buffers)

    async def _send(
        self, channel: str, prefix: list[bytes], msg: dict[str, Any], buffers: list[bytes]
    ) -> None:
        try:
            parts = [*prefix, *frames.to_wire(msg, buffers, self.key)]
        except (TypeError, ValueError) as exc:
            log.warning("dropped an unserializable %s message: %s", channel, exc)
            return
        size = sum(len(part) for part in parts)
        self._forget_sent()
        if size >= TRACK_BYTES and self._queued_bytes + size > MAX_QUEUED_BYTES:
            self._drop(channel, size)
            return
        try:
            if size >= TRACK_BYTES:
                tracker = await self.sockets[channel].send_multipart(
                    parts, flags=zmq.NOBLOCK, copy=False, track=True
                )
                if tracker is not None:
                    self._queued.append((tracker, size))
                    self._queued_bytes += size
            else:
                await self.sockets[channel].send_multipart(parts, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._drop(channel, size)  # the client's queue is at its high-water mark

    def _forget_sent(self) -> None:
        while self._queued and self._queued[0][0].done:
            _, size = self._queued.popleft()
            self._queued_bytes -= size

    def _drop(self, channel: str, size: int) -> None:
        self.dropped += 1
        self._slow_log.log(
            logging.WARNING,
            "a client is not reading: dropped %d message(s) (last: %s, %d bytes)",
            self.dropped,
            channel,
            size,
        )

    def close(self) -> None:
        self._refused_log.flush()
        self._slow_log.flush()
        self._iopub_sync = None  # a shadow: closing the socket it shadows is enough
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.sockets.clear()
