"""The control channel between a tunnel and its owner: frames both ways, over memory or a socket.

The owner (the bridge for its own sandboxes, the kernel provisioner for a plain Jupyter client's)
talks to the tunnel only through this channel: ``ready``/``exit`` events with a structured kind,
``rpc_request``s for the owner's hub, and the owner's ``interrupt``/``restart``/``shutdown`` and
``rpc_response``s (see ``kernelbridge.frames`` for the table). Two implementations, one protocol:

- :func:`memory_channel_pair`: a tunnel running inside the owner's process (the bridge);
- :class:`SocketFrameChannel`: the frame codec over a socket, for a tunnel *process*; the
  socket is a ``socketpair`` end inherited by that process, so nobody else can connect to it
  (authenticated by construction: no port, no path, no token to steal).

Both are bounded: a memory channel holds at most :data:`MEMORY_CHANNEL_FRAMES` frames per
direction (senders wait), and a stream channel decodes with the frame cap.
"""

from __future__ import annotations

import collections
import contextlib
import socket
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernelbridge import frames

MEMORY_CHANNEL_FRAMES = 64
"""Frames queued per direction of an in-process channel; the sender waits beyond (backpressure)."""
READ_CHUNK = 1 << 20


class FrameChannel(Protocol):
    """One end of a two-way channel of frames."""

    async def send(self, frame: frames.Frame) -> None:
        """Send one frame. Raises anyio.BrokenResourceError if the other end is gone."""
        ...

    async def receive(self) -> frames.Frame:
        """The next frame. Raises anyio.EndOfStream when the other end closed."""
        ...

    def receive_nowait(self) -> frames.Frame | None:
        """A frame that is already there, else None (also once the other end closed)."""
        ...

    async def aclose(self) -> None: ...


class MemoryFrameChannel(FrameChannel):
    def __init__(
        self, send: MemoryObjectSendStream[frames.Frame], receive: MemoryObjectReceiveStream[frames.Frame]
    ):
        self._send = send
        self._receive = receive

    async def send(self, frame: frames.Frame) -> None:
        await self._send.send(frame)

    async def receive(self) -> frames.Frame:
        return await self._receive.receive()

    def receive_nowait(self) -> frames.Frame | None:
        try:
            return self._receive.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


def memory_channel_pair() -> tuple[FrameChannel, FrameChannel]:
    """Two connected in-process ends: (owner end, tunnel end)."""
    a_send, b_receive = anyio.create_memory_object_stream[frames.Frame](MEMORY_CHANNEL_FRAMES)
    b_send, a_receive = anyio.create_memory_object_stream[frames.Frame](MEMORY_CHANNEL_FRAMES)
    return MemoryFrameChannel(a_send, a_receive), MemoryFrameChannel(b_send, b_receive)


class SocketFrameChannel(FrameChannel):
    """The frame codec over a connected stream socket (a socketpair end), non-blocking.

    Reads and writes wait for readiness on whatever event loop is running at the time, so an
    owner that runs each call in a fresh loop (jupyter_client's synchronous managers do) can use
    it too. Bad lines are skipped and counted.
    """

    def __init__(self, sock: socket.socket, max_frame_bytes: int = frames.MAX_FRAME_BYTES) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._decoder = frames.FrameDecoder(max_frame_bytes)
        self._ready: collections.deque[frames.Frame] = collections.deque()
        self._send_lock = anyio.Lock()
        self._eof = False
        self.dropped = 0

    async def send(self, frame: frames.Frame) -> None:
        data = memoryview(frames.encode(frame))
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

    async def receive(self) -> frames.Frame:
        while not self._ready:
            if self._eof:
                raise anyio.EndOfStream
            await anyio.wait_readable(self.sock)
            self._read_available()
        return self._ready.popleft()

    def receive_nowait(self) -> frames.Frame | None:
        """A frame if one can be read without waiting, else None (also at EOF)."""
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
                if isinstance(item, frames.FrameError):
                    self.dropped += 1
                else:
                    self._ready.append(item)
            if self._ready:
                return

    async def aclose(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
