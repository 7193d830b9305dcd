"""Serving MCP over stdio with a stdin that a signal can interrupt, and that no child can read,
and a stdout written on the event loop (the SDK's writes and flushes each take a worker thread)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import signal
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp_types import jsonrpc_message_adapter

from kernelbridge.frames import clip
from kernelbridge.server.departure import Departure

log = logging.getLogger("kernelbridge.server")


class _PipeLines:
    """Lines from a pipe, read without a worker thread.

    The SDK reads stdin with ``anyio.wrap_file``, i.e. in a worker thread that no cancellation
    can interrupt: a SIGTERM arriving while the client is silent would wait for a line that never
    comes, and the sandboxes would never be removed. Waiting for readability on the event loop
    instead makes the read cancellable. Only for pipes and sockets (epoll refuses regular files).
    """

    def __init__(self, fd: int, at_end: Callable[[], None] = lambda: None) -> None:
        self._fd = fd
        self._at_end = at_end
        """Told when stdin ends, before the SDK sees it (and cancels the requests in flight)."""
        self._buf = bytearray()
        self._scanned = 0

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        while (end := self._buf.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._buf)
            await anyio.wait_readable(self._fd)
            chunk = os.read(self._fd, READ_CHUNK)
            if not chunk:
                self._at_end()
                if not self._buf:
                    raise StopAsyncIteration
                end = len(self._buf)
                break
            self._buf += chunk
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        self._scanned = 0
        return checked_line(line.decode("utf-8", errors="replace"))


def checked_line(line: str) -> str:
    """``line``, or a repaired copy, so that a request is not silently lost.

    The SDK validates each line with pydantic, which rejects JSON that Python's own parser accepts:
    a lone surrogate escape (``"\\ud800"``) in any string. The SDK then drops the line with a
    debug log only, and the client waits forever for its answer. A line with such an escape is
    re-encoded with each lone surrogate replaced by U+FFFD (and a warning logged), so the request
    is answered. Lines without one are passed on untouched (no second parse).
    """
    if not _SURROGATE_ESCAPE.search(line):
        return line
    try:
        jsonrpc_message_adapter.validate_json(line, by_name=False)
        return line  # escaped pairs only: fine as it is
    except ValueError:
        pass
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:
        log.warning("dropped a line from the MCP client that is not JSON: %s", clip(str(exc), 200))
        return line
    fixed = _without_lone_surrogates(value)
    if fixed == value:
        return line  # invalid for another reason: the SDK answers or drops it as usual
    log.warning("replaced invalid unicode escapes (lone surrogates) in a request from the MCP client")
    return json.dumps(fixed, ensure_ascii=False)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _without_lone_surrogates(value: Any, depth: int = 0) -> Any:
    if depth > MAX_REPAIR_DEPTH:
        return None
    if isinstance(value, str):
        # UTF-16 round trip: valid pairs join, lone halves become U+FFFD.
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_without_lone_surrogates(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {
            _without_lone_surrogates(k, depth + 1): _without_lone_surrogates(v, depth + 1)
            for k, v in value.items()
        }
    return value


MAX_REPAIR_DEPTH = 200
"""Deeper values are not repaired (dropped); the SDK rejects them anyway."""


READ_CHUNK = 1 << 16


class _PipeWriter:
    """The SDK's ``stdout`` (``write`` then ``flush`` per message), written from the event loop:
    no worker-thread round trip per message, and a client that stops reading is waited for
    cancellably (a full pipe) instead of in a thread no cancellation reaches."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # O_NONBLOCK is on the wire's open file description, which only this process holds once
        # fd 1 points at stderr (children get that); _claim_stdio makes it blocking again.
        os.set_blocking(fd, False)

    async def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:
            try:
                written = os.write(self._fd, data)
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            data = data[written:]

    async def flush(self) -> None:
        """Every write is whole when it returns: nothing is buffered here."""


def _is_pipe_or_socket(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextmanager
def _claim_stdio() -> Iterator[tuple[int | None, int | None]]:
    """Move the MCP wire off fds 0 and 1 (to private fds) and put /dev/null on 0 and stderr on 1,
    so that child processes (podman, tunnels) can never read the client's messages nor tear them
    with stray output. Each is claimed only if it is a pipe or socket (what the event loop can
    wait on); None for one that is not: the SDK's own stream is used for it."""
    private_in = private_out = None
    if _is_pipe_or_socket(0):
        private_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    if private_in is not None and _is_pipe_or_socket(1):
        private_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
        os.dup2(2, 1)
    try:
        yield private_in, private_out
    finally:
        if private_in is not None:
            os.dup2(private_in, 0)
            os.close(private_in)
        if private_out is not None:
            os.set_blocking(private_out, True)  # fd 1 gets the wire's description back as it was
            os.dup2(private_out, 1)
            os.close(private_out)


async def serve_stdio(app: MCPServer[Any], departure: Departure | None = None) -> None:
    """Serve until stdin closes or SIGTERM/SIGINT/SIGHUP (``departure`` is announced first); the
    lifespan then stops every sandbox, or lets go of the durable ones."""
    leaving = departure or Departure()
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    log.warning("received %s; the bridge stops", signal.Signals(signum).name)
                    leaving.announce()
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(on_signal)
        with _claim_stdio() as (in_fd, out_fd):
            if in_fd is None:
                await app.run_stdio_async()
            else:
                # What MCPServer.run_stdio_async does, with a cancellable stdin and a threadless
                # stdout. The low-level server is reached through a private attribute: MCPServer
                # has no public way to run on given streams.
                lowlevel = app._lowlevel_server
                stdin = _PipeLines(in_fd, leaving.announce)
                stdout = _PipeWriter(out_fd) if out_fd is not None else None
                async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
        tg.cancel_scope.cancel()
