"""The control channel between a tunnel and its owner: typed messages both ways, over memory or a socket.

The messages are those of :mod:`~kernelbridge.tunnel.events`. :func:`memory_channel_pair` passes them
as objects within one process (the bridge), at most :data:`MEMORY_CHANNEL_FRAMES` per direction
(senders wait); :class:`SocketControlChannel` as frames over an inherited ``socketpair`` end (no
port, path or token: nobody else can connect), decoded once with the frame cap, what is no message
dropped and counted. Design: docs/architecture.md, "The tunnel and its channels".
"""

from __future__ import annotations

import collections
import contextlib
import socket
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernelbridge import frames
from kernelbridge.tunnel.events import ControlMessage, from_frame

MEMORY_CHANNEL_FRAMES = 64
"""Messages queued per direction of an in-process channel; the sender waits beyond (backpressure)."""
READ_CHUNK = 1 << 20


class ControlChannel(Protocol):
    """One end of a two-way channel of control messages."""

    async def send(self, message: ControlMessage) -> None:
        """Send one message. Raises anyio.BrokenResourceError if the other end is gone."""
        ...

    async def receive(self) -> ControlMessage:
        """The next message. Raises anyio.EndOfStream when the other end closed."""
        ...

    def receive_nowait(self) -> ControlMessage | None:
        """A message that is already there, else None (also once the other end closed)."""
        ...

    async def aclose(self) -> None: ...


class MemoryControlChannel(ControlChannel):
    def __init__(
        self,
        send: MemoryObjectSendStream[ControlMessage],
        receive: MemoryObjectReceiveStream[ControlMessage],
    ):
        self._send = send
        self._receive = receive

    async def send(self, message: ControlMessage) -> None:
        await self._send.send(message)

    async def receive(self) -> ControlMessage:
        return await self._receive.receive()

    def receive_nowait(self) -> ControlMessage | None:
        try:
            return self._receive.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


def memory_channel_pair() -> tuple[ControlChannel, ControlChannel]:
    """Two connected in-process ends: (owner end, tunnel end)."""
    a_send, b_receive = anyio.create_memory_object_stream[ControlMessage](MEMORY_CHANNEL_FRAMES)
    b_send, a_receive = anyio.create_memory_object_stream[ControlMessage](MEMORY_CHANNEL_FRAMES)
    return MemoryControlChannel(a_send, a_receive), MemoryControlChannel(b_send, b_receive)


class SocketControlChannel(ControlChannel):
    """Control messages as frames over a connected stream socket (a socketpair end), non-blocking.

    Reads and writes wait for readiness on whatever event loop is running at the time, so an
    owner that runs each call in a fresh loop (jupyter_client's synchronous managers do) can use
    it too. Lines that are not frames, and frames that are not control messages, are skipped and
    counted in :attr:`dropped`.
    """

    def __init__(self, sock: socket.socket, max_frame_bytes: int = frames.MAX_FRAME_BYTES) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._decoder = frames.FrameDecoder(max_frame_bytes)
        self._ready: collections.deque[ControlMessage] = collections.deque()
        self._send_lock = anyio.Lock()
        self._eof = False
        self.dropped = 0

    async def send(self, message: ControlMessage) -> None:
        data = memoryview(frames.encode(message.to_frame()))
        async with self._send_lock:
            while data:
                try:
                    sent = self.sock.send(data)
                except (BlockingIOError, InterruptedError):
                    await anyio.wait_writable(self.sock)
                    continue
                except OSError as exc:
                    raise anyio.BrokenResourceError(str(exc)) from exc
                data = data[sent:]

    async def receive(self) -> ControlMessage:
        while not self._ready:
            if self._eof:
                raise anyio.EndOfStream
            await anyio.wait_readable(self.sock)
            self._read_available()
        return self._ready.popleft()

    def receive_nowait(self) -> ControlMessage | None:
        """A message if one can be read without waiting, else None (also at EOF)."""
        if not self._ready and not self._eof:
            self._read_available()
        return self._ready.popleft() if self._ready else None

    def _read_available(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._eof = True
                return
            for item in self._decoder.feed(chunk):
                message = None if isinstance(item, frames.FrameError) else from_frame(item)
                if message is None:
                    self.dropped += 1
                else:
                    self._ready.append(message)
            if self._ready:
                return

    async def aclose(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
