"""A container's stdio over a hijacked engine connection, as a :class:`ContainerStream`.

Wire layout (the engine's attach stream when the container has no TTY): stdin goes out raw; what
comes in is multiplexed in frames of an 8-byte header and a payload::

    byte 0      stream: 0 stdin (never sent here), 1 stdout, 2 stderr
    bytes 1-3   zero
    bytes 4-7   payload length, big-endian unsigned 32-bit

:class:`FrameDemux` is the codec (bytes in, (stream, payload) out, no I/O); :class:`EngineStream`
feeds it from the socket, hands stdout payloads to ``receive`` and keeps the last stderr lines in
a bounded :class:`StderrTail`.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Iterator

import anyio
import httpcore2

from kernelbridge.runtime.base import ContainerStream
from kernelbridge.runtime.engine.transport import HALF_CLOSE

HEADER = struct.Struct(">BxxxI")
STDOUT = 1
STDERR = 2
READ_SIZE = 256 * 1024
"""Bytes asked of the socket per read: large frames (32 MiB) pass in few reads."""
TAIL_LINES = 40
TAIL_LINE_CHARS = 500
"""Each kept stderr line is cut to this: a kernel can print a megabyte on one line."""


class FrameDemux:
    """Splits the engine's multiplexed stream into (stream type, payload) pieces.

    Payloads are yielded as they arrive, possibly in several pieces for one frame, so a 32 MiB
    frame is never held whole here.
    """

    def __init__(self) -> None:
        self._header = b""
        self._stream = 0
        self._left = 0

    @property
    def mid_frame(self) -> bool:
        return bool(self._header) or self._left > 0

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        view = memoryview(data)
        while view:
            if self._left == 0:
                need = HEADER.size - len(self._header)
                self._header += bytes(view[:need])
                view = view[need:]
                if len(self._header) < HEADER.size:
                    return
                self._stream, self._left = HEADER.unpack(self._header)
                self._header = b""
                continue
            piece = bytes(view[: self._left])
            view = view[len(piece) :]
            self._left -= len(piece)
            yield self._stream, piece


class StderrTail:
    """The last ``lines`` lines of a byte stream, each cut to ``chars`` characters."""

    def __init__(self, lines: int = TAIL_LINES, chars: int = TAIL_LINE_CHARS) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._partial = bytearray()
        self._chars = chars

    def feed(self, data: bytes) -> None:
        parts = data.split(b"\n")
        for part in parts[:-1]:
            self._push(bytes(self._partial) + part)
            self._partial.clear()
        # Bounded: a line with no newline keeps only its head (4 bytes per character, at worst).
        room = self._chars * 4 - len(self._partial)
        if room > 0:
            self._partial += parts[-1][:room]

    def _push(self, line: bytes) -> None:
        self._lines.append(line.decode(errors="replace").rstrip("\r")[: self._chars])

    def lines(self) -> list[str]:
        tail = list(self._lines)
        if self._partial:
            tail.append(bytes(self._partial).decode(errors="replace")[: self._chars])
        return tail[-(self._lines.maxlen or 1) :]


class EngineStream(ContainerStream):
    """stdin/stdout of one container over a hijacked connection; stderr into a bounded tail."""

    def __init__(self, response: httpcore2.Response, network: httpcore2.AsyncNetworkStream) -> None:
        self._response = response
        self._network = network
        self._demux = FrameDemux()
        self._tail = StderrTail()
        self._pending = memoryview(b"")
        self._eof = False
        self._closed = False
        self._stdin_closed = False
        self._receive_guard = anyio.ResourceGuard("reading from")
        self._send_guard = anyio.ResourceGuard("writing to")

    def stderr_tail(self) -> list[str]:
        return self._tail.lines()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """The next stdout bytes. Raises EndOfStream when the container's stdout is done,
        ClosedResourceError after ``aclose``, BrokenResourceError when the connection broke."""
        with self._receive_guard:
            while not self._pending:
                if self._closed:
                    raise anyio.ClosedResourceError
                if self._eof:
                    raise anyio.EndOfStream
                try:
                    data = await self._network.read(READ_SIZE)
                except httpcore2.ReadError as exc:
                    if self._closed:
                        raise anyio.ClosedResourceError from None
                    raise anyio.BrokenResourceError(str(exc)) from exc
                if not data:
                    self._eof = True
                    continue
                out = []
                for stream, payload in self._demux.feed(data):
                    if stream == STDOUT:
                        out.append(payload)
                    elif stream == STDERR:
                        self._tail.feed(payload)
                self._pending = memoryview(b"".join(out))
            chunk = bytes(self._pending[:max_bytes])
            self._pending = self._pending[max_bytes:]
            return chunk

    async def send(self, item: bytes) -> None:
        """Write to the container's stdin. Raises ClosedResourceError after ``aclose`` or
        ``send_eof``, BrokenResourceError when the connection broke."""
        with self._send_guard:
            if self._closed or self._stdin_closed:
                raise anyio.ClosedResourceError
            try:
                await self._network.write(item)
            except httpcore2.WriteError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        """Close the container's stdin (a half-close: stdout keeps flowing)."""
        if self._closed or self._stdin_closed:
            return
        self._stdin_closed = True
        half_close = self._network.get_extra_info(HALF_CLOSE)
        try:
            await half_close()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing the 101 response closes its connection (it can never go back to the pool).
        with anyio.CancelScope(shield=True):
            try:
                await self._response.aclose()
            finally:
                await self._network.aclose()
