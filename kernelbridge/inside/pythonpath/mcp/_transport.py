"""The kernel end of the rpc channel to the host (docs/rpc.md): requests out, answers matched by id.

Owns the one socket whose fd the agent passes in ``KERNELBRIDGE_RPC_FD``. Thread-safe: requests are
written whole under a lock; one daemon reader thread resolves a future per id and drops anything
malformed or over ``frames.MAX_RPC_BYTES``. Sync callers block (a KeyboardInterrupt ends the wait and
forgets the request), async callers await. Once the socket closes, every pending and later call
fails with McpUnavailable: nothing hangs. Methods and params are the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import socket
import threading
from concurrent.futures import Future
from typing import Any

from kernelbridge import frames

from ._errors import McpError, McpInvalidParams, McpTooLarge, McpUnavailable, error_from_response

FD_VARIABLE = "KERNELBRIDGE_RPC_FD"
NO_HOST = (
    "no host MCP servers in this kernel: it was not started by kernelbridge"
    f" ({FD_VARIABLE} is not set), so mcp_* proxies and runtime calls cannot reach a host"
)
PROBE_TIMEOUT = 5.0
"""Longest :func:`unavailable` waits for the host's answer (it answers ``list_servers`` from memory)."""
READ_CHUNK = 256 * 1024
# An oversized answer is discarded as it streams in; its first bytes are kept to find its id
# (`{"type":"rpc_response","id":7,...`), so that the call it answers fails instead of waiting forever.
HEAD_BYTES = 128
_HEAD_ID = re.compile(rb'^\s*\{\s*"type"\s*:\s*"rpc_response"\s*,\s*"id"\s*:\s*(\d{1,18})\b')

Outcome = tuple[bool, Any]
"""What the reader thread hands to a waiting caller: (True, result) or (False, McpError)."""


class LineSplitter:
    """Bytes in, complete lines out; a line over ``max_bytes`` is reported as (None, head)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: list[bytes] = []
        self._size = 0
        self._head = b""
        self._discarding = False

    def feed(self, data: bytes) -> list[tuple[bytes | None, bytes]]:
        lines: list[tuple[bytes | None, bytes]] = []
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            self._keep(data[start:newline])
            start = newline + 1
            if self._discarding:
                lines.append((None, self._head))
            else:
                lines.append((b"".join(self._chunks), b""))
            self._chunks, self._size, self._head, self._discarding = [], 0, b"", False
        self._keep(data[start:])
        return lines

    def _keep(self, piece: bytes) -> None:
        if not piece or (self._discarding and len(self._head) >= HEAD_BYTES):
            return
        if self._discarding:
            self._head = (self._head + piece)[:HEAD_BYTES]
        elif self._size + len(piece) > self.max_bytes:
            self._head = (b"".join(self._chunks) + piece)[:HEAD_BYTES]
            self._chunks, self._size, self._discarding = [], 0, True
        else:
            self._chunks.append(piece)
            self._size += len(piece)


class RpcClient:
    """One rpc channel over a connected stream socket. Thread-safe; any number of calls in flight."""

    def __init__(self, sock: socket.socket, max_bytes: int = frames.MAX_RPC_BYTES) -> None:
        self._sock = sock
        self._max_bytes = max_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Outcome]] = {}
        self._lock = threading.Lock()  # guards _pending and _closed
        self._write_lock = threading.Lock()
        self._closed: str | None = None
        # A write cut short (KeyboardInterrupt inside sendall) leaves half a line on the wire; the
        # next write starts with a newline so the host drops that fragment instead of the next request.
        self._torn_write = False
        self._owner_pid = os.getpid()
        self.dropped = 0
        """Answers dropped: malformed lines, unknown ids, oversized lines (for debugging)."""
        self._reader = threading.Thread(target=self._read_loop, name="kernelbridge-mcp-rpc", daemon=True)
        self._reader.start()

    # -- requests ------------------------------------------------------------------------------
    def submit(self, method: str, params: dict[str, Any], cell: str | None) -> tuple[int, Future[Outcome]]:
        """Send one request; return its id and the future its answer resolves.

        Raises McpUnavailable (closed, forked child), McpTooLarge (line over the cap, not sent),
        McpInvalidParams (params not JSON-serializable).
        """
        __tracebackhide__ = True
        if os.getpid() != self._owner_pid:
            raise McpUnavailable(
                "host MCP calls work only in the kernel process itself, not in a forked child process"
            )
        with self._lock:
            if self._closed is not None:
                raise McpUnavailable(self._closed)
            request_id = next(self._ids)
        request = {
            "type": frames.RPC_REQUEST,
            "id": request_id,
            "method": method,
            "params": params,
            "cell": cell,
        }
        try:
            line = frames.encode(request)
        except (TypeError, ValueError) as exc:
            raise McpInvalidParams(f"arguments must be JSON-serializable: {exc}") from None
        if len(line) > self._max_bytes:
            raise McpTooLarge(
                f"this request is {len(line):,} bytes, over the {self._max_bytes:,} byte limit of a"
                " host MCP call; send less data per call (split it into several calls)"
            )
        future: Future[Outcome] = Future()
        with self._lock:
            if self._closed is not None:
                raise McpUnavailable(self._closed)
            self._pending[request_id] = future
        try:
            self._send(line)
        except BaseException:
            self.forget(request_id)
            raise
        return request_id, future

    def _send(self, line: bytes) -> None:
        with self._write_lock:
            if self._torn_write:
                line = b"\n" + line
            self._torn_write = True
            try:
                self._sock.sendall(line)
            except OSError as exc:
                self._torn_write = False
                reason = _gone("closed", exc)
                self._close(reason)
                raise McpUnavailable(reason) from None
            self._torn_write = False

    def forget(self, request_id: int) -> None:
        """Stop waiting for an answer (the caller gave up); a late answer is dropped."""
        with self._lock:
            self._pending.pop(request_id, None)

    def call(self, method: str, params: dict[str, Any], cell: str | None) -> Any:
        """Send a request and block until its answer. Raises the answer's McpError.

        A KeyboardInterrupt (the cell was interrupted) ends the wait at once; the host still
        finishes the call, and its answer is dropped.
        """
        __tracebackhide__ = True
        request_id, future = self.submit(method, params, cell)
        try:
            ok, value = future.result()
        finally:
            self.forget(request_id)
        if not ok:
            raise value
        return value

    async def call_async(self, method: str, params: dict[str, Any], cell: str | None) -> Any:
        """Send a request and await its answer. Raises the answer's McpError."""
        __tracebackhide__ = True
        request_id, future = self.submit(method, params, cell)
        try:
            ok, value = await asyncio.wrap_future(future)
        finally:
            self.forget(request_id)
        if not ok:
            raise value
        return value

    # -- answers -------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        splitter = LineSplitter(self._max_bytes)
        reason = _gone("closed", None)
        try:
            while True:
                data = self._sock.recv(READ_CHUNK)
                if not data:
                    break
                for line, head in splitter.feed(data):
                    try:
                        self._dispatch(line, head)
                    except Exception:  # a bug here must not kill the reader: drop the line
                        self.dropped += 1
        except OSError as exc:
            reason = _gone("failed", exc)
        finally:
            self._close(reason)
            # Only the reader closes the fd, after its last recv: a writer that races with this gets
            # EBADF from the closed socket object (never a reused fd number) and reports McpUnavailable.
            self._sock.close()

    def _dispatch(self, line: bytes | None, head: bytes) -> None:
        if line is None:
            self.dropped += 1
            match = _HEAD_ID.match(head)
            if match:
                error = McpTooLarge(f"the host's answer exceeds the {self._max_bytes:,} byte limit")
                self._resolve(int(match.group(1)), (False, error))
            return
        frame = frames.parse_line(line) if line.strip() else None
        if not isinstance(frame, dict) or frame.get("type") != frames.RPC_RESPONSE:
            self.dropped += 1
            return
        request_id = frame.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            self.dropped += 1
            return
        if "error" in frame:
            outcome: Outcome = (False, error_from_response(frame["error"]))
        elif "result" in frame:
            outcome = (True, frame["result"])
        else:
            outcome = (False, McpError("the host sent an answer with neither result nor error"))
        self._resolve(request_id, outcome)

    def _resolve(self, request_id: int, outcome: Outcome) -> None:
        with self._lock:
            future = self._pending.pop(request_id, None)
        if future is None:
            self.dropped += 1  # unknown, or given up by an interrupted caller
            return
        with contextlib.suppress(Exception):  # already cancelled by an awaiting task
            future.set_result(outcome)

    def _close(self, reason: str) -> None:
        with self._lock:
            if self._closed is None:
                self._closed = reason
            pending, self._pending = self._pending, {}
        for future in pending.values():
            with contextlib.suppress(Exception):
                future.set_result((False, McpUnavailable(reason)))
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    @property
    def closed(self) -> str | None:
        """Why the channel is closed, or None while it is open."""
        return self._closed

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)


# -- the kernel's one channel -------------------------------------------------------------------------
# A process has at most one rpc fd (the agent passes exactly one), so the client is process-wide state,
# created on first use (or eagerly by the IPython extension) and never replaced.
_client: RpcClient | None = None
_failure: str | None = None
_connect_lock = threading.Lock()


def connect() -> RpcClient:
    """The kernel's rpc client, connected on first use. Raises McpUnavailable without a host."""
    __tracebackhide__ = True
    global _client, _failure
    with _connect_lock:
        if _client is None and _failure is None:
            try:
                _client = _open_from_environment()
            except McpUnavailable as exc:
                _failure = exc.message
    if _client is None:
        raise McpUnavailable(_failure or NO_HOST)
    return _client


def _open_from_environment() -> RpcClient:
    raw = os.environ.get(FD_VARIABLE)
    if raw is None:
        raise McpUnavailable(NO_HOST)
    # Child processes of the kernel (`!python ...`) must not think they have a host: the fd is not
    # inherited either (see below), and two readers on one socket would steal each other's answers.
    os.environ.pop(FD_VARIABLE, None)
    try:
        fd = int(raw)
        sock = socket.socket(fileno=fd)
    except (ValueError, OSError) as exc:
        raise McpUnavailable(f"{FD_VARIABLE}={raw[:20]!r} is not a usable socket ({exc})") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise McpUnavailable(f"{FD_VARIABLE}={raw[:20]!r} is not a unix stream socket")
    sock.set_inheritable(False)
    sock.setblocking(True)
    return RpcClient(sock)


def _gone(what: str, exc: OSError | None) -> str:
    detail = f" ({exc.strerror or exc})" if exc is not None else ""
    return (
        f"the connection to the host {what}{detail}: host MCP servers cannot be reached from this kernel"
        " any more (the session closed or the sandbox agent stopped)"
    )


def current_cell() -> str | None:
    """The msg_id of the execute request running now (docs/rpc.md ``cell``), or None."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        msg_id = kernel.get_parent()["header"]["msg_id"] if kernel is not None else None
    except Exception:  # no IPython, no parent yet, an unexpected ipykernel: the cell is informational
        return None
    return msg_id[:200] if isinstance(msg_id, str) and msg_id else None


def unavailable(timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why no host serves this kernel (the message its calls raise McpUnavailable with), or None
    when a host answers (or does not answer within ``timeout``: then it cannot be told)."""
    try:
        client = connect()
        request_id, future = client.submit("list_servers", {}, current_cell())
    except McpUnavailable as exc:
        return exc.message
    except McpError:
        return None
    try:
        ok, value = future.result(timeout)
    except TimeoutError:
        return None
    finally:
        client.forget(request_id)
    return value.message if not ok and isinstance(value, McpUnavailable) else None


def request(method: str, params: dict[str, Any]) -> Any:
    """Blocking rpc call from any thread. Raises McpError subclasses."""
    __tracebackhide__ = True
    return connect().call(method, params, current_cell())


async def request_async(method: str, params: dict[str, Any]) -> Any:
    """Awaitable rpc call. Raises McpError subclasses."""
    __tracebackhide__ = True
    return await connect().call_async(method, params, current_cell())
