"""Frames for the host, written to the agent's stdout without ever blocking the relay.

Why not plain blocking writes: the host reads the agent's stdout and writes its stdin, and both
directions have bounded buffers. An agent blocked writing stdout no longer reads stdin; if the
host is at that moment blocked writing stdin (answering a burst of the kernel's host calls, say),
neither side moves again: a deadlock. So writes are non-blocking into a queue, stdin is always
read, and when the queue passes :data:`HIGH_WATER` the agent stops reading from the kernel (its
messages, its output, its rpc socket) until the host has taken the backlog: backpressure reaches
the kernel, never the host's own frames.
"""

from __future__ import annotations

import collections
import os
import select
import time

HIGH_WATER = 8 * 1024 * 1024
"""Queued bytes past which the kernel's sources are paused. One frame may exceed it (a 32 MiB
display); the queue then holds that frame and nothing more."""


class Outbox:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._queue: collections.deque[memoryview] = collections.deque()
        self.pending = 0

    @property
    def full(self) -> bool:
        return self.pending > HIGH_WATER

    def put(self, data: bytes) -> None:
        """Queue ``data`` and write what the pipe takes now. Raises BrokenPipeError when the host
        is gone."""
        self._queue.append(memoryview(data))
        self.pending += len(data)
        self.flush()

    def flush(self) -> None:
        """Write as much as the pipe takes without blocking."""
        while self._queue:
            head = self._queue[0]
            try:
                written = os.write(self.fd, head)
            except BlockingIOError:
                return
            self.pending -= written
            if written == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[written:]

    def drain(self, timeout: float) -> bool:
        """Block until everything is written or ``timeout`` passes (outside the relay loop only:
        at start-up and on exit). Returns whether the queue is empty."""
        deadline = time.monotonic() + timeout
        while self._queue:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([], [self.fd], [], left)
            self.flush()
        return True
