"""A non-blocking write queue: bytes waiting for a file descriptor that takes them as it can.

The agent writes to two ends that must never block its poll loop: the host link's stdout (frames
for the host; ``host_link.py`` says which deadlock a blocking write there would risk) and the rpc
relay's socket (answers for a kernel that may have stopped reading). Each queues here what its fd
does not take at once and writes the rest when the poller says the fd is writable.

The queue knows nothing of limits: what to do past a bound is its owner's policy (the host link
pauses the kernel's sources above a high-water mark; the rpc relay drops an answer past its cap).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

Write = Callable[[memoryview], int]
"""Writes some prefix of its argument and returns how many bytes (``os.write`` on a non-blocking
fd, ``socket.send`` on a non-blocking socket); raises BlockingIOError when it takes nothing now."""


class WriteQueue:
    """Bytes queued for ``write``, oldest first; :attr:`pending` counts them."""

    def __init__(self, write: Write) -> None:
        self._write = write
        self._queue: collections.deque[memoryview] = collections.deque()
        self.pending = 0

    def __repr__(self) -> str:
        return f"<WriteQueue {self.pending} bytes in {len(self._queue)} pieces>"

    def append(self, data: bytes) -> None:
        """Queue ``data`` behind what is already queued (nothing is written yet)."""
        self._queue.append(memoryview(data))
        self.pending += len(data)

    def flush(self) -> None:
        """Write as much as the fd takes without blocking.

        Raises whatever ``write`` raises besides BlockingIOError and InterruptedError (e.g.
        BrokenPipeError once the reader is gone); what was not written stays queued.
        """
        while self._queue:
            head = self._queue[0]
            try:
                written = self._write(head)
            except (BlockingIOError, InterruptedError):
                return
            self.pending -= written
            if written == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[written:]

    def clear(self) -> None:
        """Forget everything queued (the reader is gone)."""
        self._queue.clear()
        self.pending = 0
