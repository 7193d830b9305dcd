"""A pod's stdio over ``pods/attach`` or ``pods/exec``, as a :class:`ContainerStream`.

The protocol is ``v5.channel.k8s.io`` over one WebSocket (Kubernetes >= 1.30; no older subprotocol is
offered). :class:`ChannelCodec` does no I/O; :class:`KubeStream` feeds it from the runtime's pool and
sends stdin in pieces of :data:`STDIN_CHUNK`. Design: ``docs/kubernetes.md`` ("stdio over pods/attach").
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import wsproto
import wsproto.connection
import wsproto.events
import wsproto.utilities

from kernelbridge.runtime.base import ContainerStream
from kernelbridge.runtime.engine.stream import READ_SIZE, TAIL_LINES, StderrTail

SUBPROTOCOL = "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
STDIN_CHUNK = 1 << 20
LOG_WAIT = 3.0
STATUS_LIMIT = 16 * 1024
"""Bytes of a final status kept (a Status is a few hundred bytes)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes of one channel (a whole message, or a part of one)."""

    channel: int
    data: bytes


class ChannelCodec:
    """v5.channel.k8s.io over wsproto: ``feed`` bytes from the socket, get pieces and the bytes
    to write back (pongs, the close handshake); ``stdin``/``close_stdin``/``close`` make bytes
    to send. ``closed`` once the server closed the WebSocket."""

    def __init__(self) -> None:
        self._ws = wsproto.connection.Connection(wsproto.ConnectionType.CLIENT)
        self._channel: int | None = None
        """The channel of the message being received (None between messages)."""
        self.closed = False

    def feed(self, data: bytes) -> tuple[list[Piece], bytes]:
        """Pieces of the channels in ``data`` and what must be written back. Raises
        wsproto's RemoteProtocolError on a broken frame (the caller breaks the stream off)."""
        self._ws.receive_data(data if data else None)
        pieces: list[Piece] = []
        reply = b""
        for event in self._ws.events():
            if isinstance(event, wsproto.events.BytesMessage | wsproto.events.TextMessage):
                payload = event.data.encode() if isinstance(event.data, str) else bytes(event.data)
                pieces.extend(self._pieces(payload, event.message_finished))
            elif isinstance(event, wsproto.events.Ping):
                reply += self._ws.send(event.response())
            elif isinstance(event, wsproto.events.CloseConnection):
                self.closed = True
                if self._ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                    reply += self._ws.send(event.response())
        return pieces, reply

    def _pieces(self, payload: bytes, finished: bool) -> Iterator[Piece]:
        if self._channel is None:
            if not payload:
                return
            self._channel, payload = payload[0], payload[1:]
        if payload:
            yield Piece(self._channel, payload)
        if finished:
            self._channel = None

    def stdin(self, data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        for offset in range(0, len(data), STDIN_CHUNK):
            chunk = bytes([STDIN]) + bytes(view[offset : offset + STDIN_CHUNK])
            yield self._ws.send(wsproto.events.BytesMessage(data=chunk))

    def close_stdin(self) -> bytes:
        return self._ws.send(wsproto.events.BytesMessage(data=bytes([CLOSE, STDIN])))

    def close(self) -> bytes:
        if self._ws.state is not wsproto.connection.ConnectionState.OPEN:
            return b""
        return self._ws.send(wsproto.events.CloseConnection(code=1000))


def exit_status(status: bytes) -> tuple[int | None, str]:
    """A final status (channel 3) as (exit code, message): 0 for Success, the ``ExitCode`` cause
    of a NonZeroExitCode failure, None for another failure (its message says why)."""
    try:
        data: Any = json.loads(status[:STATUS_LIMIT])
    except ValueError:
        return None, status[:200].decode(errors="replace")
    if not isinstance(data, dict):
        return None, ""
    if data.get("status") == "Success":
        return 0, ""
    message = str(data.get("message") or "")[:500]
    causes = (data.get("details") or {}).get("causes") or []
    for cause in causes:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(str(cause.get("message"))), message
            except (TypeError, ValueError):
                break
    return None, message


def fuller_tail(seen: list[str], logged: list[str]) -> list[str]:
    """What a pod said on stderr: the attachment's own tail (``seen``), or the log's when that
    holds more and ends with all the attachment saw (it began late). The log mixes in stdout, so
    a log that does not end with ``seen`` is not the stderr's and the attachment's tail stands."""
    if not seen:
        return list(logged[-TAIL_LINES:])
    if len(logged) > len(seen) and logged[-len(seen) :] == seen:
        return list(logged[-TAIL_LINES:])
    return seen


class KubeStream(ContainerStream):
    """stdin/stdout of one pod's container (or exec) over a WebSocket; stderr into a bounded tail."""

    def __init__(
        self,
        response: httpx2.Response,
        network: Any,
        *,
        log_tail: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        self._response = response
        self._network = network
        """httpcore2's network stream of the upgraded connection (read/write/aclose)."""
        self._codec = ChannelCodec()
        self._tail = StderrTail()
        self._log_tail = log_tail
        """Where the container's log is read at the end: a command that failed at once may have
        said all or most of it before the attachment began (see ``fuller_tail``)."""
        self._logged: list[str] = []
        self._pending = memoryview(b"")
        self._status = b""
        self._eof = False
        self._closed = False
        self._stdin_closed = False
        self._write_lock = anyio.Lock()
        self._receive_guard = anyio.ResourceGuard("reading from")
        self._send_guard = anyio.ResourceGuard("writing to")

    def stderr_tail(self) -> list[str]:
        return fuller_tail(self._tail.lines(), self._logged)

    @property
    def exit_code(self) -> int | None:
        """The command's exit status once the stream ended with one (exec), else None."""
        return exit_status(self._status)[0] if self._status else None

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """The next stdout bytes. Raises EndOfStream when the pod's stdout is done,
        ClosedResourceError after ``aclose``, BrokenResourceError when the connection broke."""
        with self._receive_guard:
            while not self._pending:
                if self._closed:
                    raise anyio.ClosedResourceError
                if self._eof:
                    raise anyio.EndOfStream
                await self._read_some()
            chunk = bytes(self._pending[:max_bytes])
            self._pending = self._pending[max_bytes:]
            return chunk

    async def _read_some(self) -> None:
        try:
            data = await self._network.read(READ_SIZE)
        except Exception as exc:  # httpcore2's ReadError, or an OSError from under it
            if self._closed:
                raise anyio.ClosedResourceError from None
            raise anyio.BrokenResourceError(str(exc) or type(exc).__name__) from exc
        try:
            pieces, reply = self._codec.feed(data)
        except wsproto.utilities.RemoteProtocolError as exc:
            raise anyio.BrokenResourceError(f"a broken WebSocket frame: {exc}") from None
        if reply:
            await self._write(reply)
        out = []
        for piece in pieces:
            if piece.channel == STDOUT:
                out.append(piece.data)
            elif piece.channel == STDERR:
                self._tail.feed(piece.data)
            elif piece.channel == STATUS and len(self._status) < STATUS_LIMIT:
                self._status += piece.data[: STATUS_LIMIT - len(self._status)]
        self._pending = memoryview(b"".join(out))
        if not data or self._codec.closed:
            self._eof = True
            if self._log_tail is not None:
                with anyio.move_on_after(LOG_WAIT):
                    self._logged = await self._log_tail()

    async def _write(self, data: bytes) -> None:
        async with self._write_lock:
            try:
                await self._network.write(data)
            except Exception as exc:  # httpcore2's WriteError, or an OSError from under it
                raise anyio.BrokenResourceError(str(exc) or type(exc).__name__) from exc

    async def send(self, item: bytes) -> None:
        """Write to the pod's stdin. Raises ClosedResourceError after ``aclose`` or ``send_eof``,
        BrokenResourceError when the connection broke."""
        with self._send_guard:
            if self._closed or self._stdin_closed:
                raise anyio.ClosedResourceError
            if self._codec.closed:
                raise anyio.BrokenResourceError("the API server closed the stream")
            try:
                for frame in self._codec.stdin(item):
                    await self._write(frame)
            except wsproto.utilities.LocalProtocolError as exc:  # closed by the server meanwhile
                raise anyio.BrokenResourceError(str(exc)) from None

    async def send_eof(self) -> None:
        """Close the pod's stdin (the v5 half-close: stdout keeps flowing)."""
        if self._closed or self._stdin_closed:
            return
        self._stdin_closed = True
        if self._codec.closed:
            return  # the server ended the stream: stdin is closed with it
        try:
            await self._write(self._codec.close_stdin())
        except wsproto.utilities.LocalProtocolError as exc:
            raise anyio.BrokenResourceError(str(exc)) from None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            try:
                if not self._codec.closed:
                    await self._write(self._codec.close())
            except (anyio.BrokenResourceError, wsproto.utilities.LocalProtocolError):
                pass
            finally:
                await self._response.aclose()
                await self._network.aclose()


class EndedStream(ContainerStream):
    """The stream of a pod whose container ended before it could be attached to: no stdout,
    and the stderr of its log (what a failed start said)."""

    def __init__(self, tail: list[str]) -> None:
        self._tail = tail
        self._closed = False

    def stderr_tail(self) -> list[str]:
        return list(self._tail)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise anyio.ClosedResourceError
        raise anyio.EndOfStream

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        raise anyio.ClosedResourceError if self._closed else anyio.BrokenResourceError("the pod has ended")

    async def send_eof(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True
