"""A :class:`ContainerStream` over a child process's stdio (the CLI backend, and the test double in
:mod:`kernelbridge.testing`).

The child is a runtime client (``podman start --attach --interactive``) or, in tests, the agent
itself. Its stdout carries the frames; its stderr is drained into a bounded tail by a task in the
backend's task group (an undrained stderr pipe would block the child once 64 KiB are written).
"""

from __future__ import annotations

import contextlib
from collections import deque

import anyio
import anyio.abc
from anyio.abc import Process

from kernelbridge.runtime.base import ContainerStream
from kernelbridge.runtime.process import end_process

STDERR_LINES = 40
"""Lines of stderr kept: enough to explain a failed start, never a growing buffer."""
STDERR_LINE_CHARS = 500
CLOSE_GRACE = 2.0
"""Seconds the child gets to exit after its stdin closed before it is killed."""


class ProcessStream(ContainerStream):
    """stdin/stdout of ``process`` as one duplex byte stream; stderr kept as a bounded tail."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._tail: deque[str] = deque(maxlen=STDERR_LINES)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        assert self.process.stdout is not None
        return await self.process.stdout.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(item)

    async def send_eof(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def aclose(self) -> None:
        """Close stdin (the agent exits on EOF), give the child a moment, then kill it.
        Shielded and bounded: this also runs while the owner is being cancelled."""
        with anyio.CancelScope(shield=True):
            await end_process(self.process, ask=self.send_eof, grace=CLOSE_GRACE)
            with contextlib.suppress(Exception):
                await self.process.aclose()

    def stderr_tail(self) -> list[str]:
        return list(self._tail)

    async def drain_stderr(self) -> None:
        """Read stderr until EOF into the bounded tail. Run it in the backend's task group."""
        stderr = self.process.stderr
        if stderr is None:
            return
        pending = b""
        try:
            async for chunk in stderr:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._keep(line)
                pending = pending[-STDERR_LINE_CHARS * 4 :]  # a line without end stays bounded
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            pass
        finally:
            if pending:
                self._keep(pending)

    def _keep(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if text:
            self._tail.append(text[:STDERR_LINE_CHARS])


class StderrDrains:
    """The task group in which a backend drains the stderr of the ProcessStreams it hands out:
    opened by the backend's ``__aenter__``, cancelled (draining ends) by its ``aclose``."""

    def __init__(self) -> None:
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def is_open(self) -> bool:
        return self._tg is not None

    async def open(self) -> None:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()

    def drain(self, stream: ProcessStream) -> None:
        """Drain ``stream``'s stderr until EOF. Raises RuntimeError when not open."""
        if self._tg is None:
            raise RuntimeError("a ProcessStream's stderr can only be drained while its backend is open")
        self._tg.start_soon(stream.drain_stderr)

    async def aclose(self) -> None:
        if self._tg is not None:
            tg, self._tg = self._tg, None
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
