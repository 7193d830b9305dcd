"""Stream helpers of the client pool: a server's stderr as a bounded log, and a transport whose
end is observed. Both sit between the MCP SDK's transports and :mod:`kernelbridge.hub.clients`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

log = logging.getLogger("kernelbridge.hub.clients")

LOG_BYTES = 1024 * 1024
"""Per server stderr log file, plus one rotated file: a chatty server cannot fill the disk."""
TAIL_LINES = 50
MAX_LINE_CHARS = 1000


class StderrLog:
    """A server's stderr: a size-bounded file (rotated once) and the last lines in memory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = b""

    async def drain(self, fd: int) -> None:
        try:
            while True:
                await anyio.wait_readable(fd)
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                self.write(chunk)
        finally:
            os.close(fd)

    def write(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-MAX_LINE_CHARS:]
        self.tail.extend(line.decode(errors="replace")[:MAX_LINE_CHARS] for line in lines)
        if self.path is None:
            return
        try:
            if self.path.exists() and self.path.stat().st_size + len(chunk) > LOG_BYTES:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, chunk[-LOG_BYTES:])
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("host server log %s disabled: %s", self.path.name, exc.strerror)
            self.path = None


@asynccontextmanager
async def watch_transport(transport: Any, on_end: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The transport, with its read stream watched: ``on_end()`` runs when it ends."""
    async with transport as (read_stream, write_stream):
        watched = WatchedReadStream(read_stream, on_end)
        try:
            yield watched, write_stream
        finally:
            on_end()


class WatchedReadStream:
    """Delegates to the transport's read stream; calls ``on_end`` at its end or on close.

    ``last_context`` is passed through: the SDK's dispatcher reads it from the stream to run each
    message in its sender's context.
    """

    def __init__(self, inner: Any, on_end: Any) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    async def __aenter__(self) -> WatchedReadStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
