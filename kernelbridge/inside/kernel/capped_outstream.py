"""The kernel's stdout/stderr inside the sandbox: ipykernel's OutStream with bounded messages.

Installed with ``--IPKernelApp.outstream_class``. Once :data:`MESSAGE_CHARS` are buffered it flushes
and waits for the send, so messages stay small and a printing cell is slowed to the speed output
leaves the kernel; past :data:`CELL_CAP_CHARS` of one request's output (per parent msg_id, per
stream) the rest is discarded, with one notice. 32 MiB of output (the tunnel's contract) passes
whole. ``flush`` waits for the IOPub thread only when something written is not sent yet. Why:
docs/design/sandbox.md.
"""

from __future__ import annotations

import threading
from typing import Any

from ipykernel.iostream import OutStream

MESSAGE_CHARS = 1 << 20
CELL_CAP_CHARS = 64 << 20


class CappedOutStream(OutStream):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cap_lock = threading.Lock()
        self._cap_parent: object = None
        self._cap_written = 0
        self._cap_unflushed = 0
        self._cap_noticed = False
        self._count_lock = threading.Lock()
        """Taken by writing threads only, never by the IOPub thread (a fork while that thread held
        a lock would leave the child's copy locked for good)."""
        self._written = 0
        """Writes taken into the buffers so far (counted after each is in)."""
        self._sent = 0
        """Writes known sent: the count a finished ``_flush`` saw before it took the buffers. Set by
        the IOPub thread alone (or by the caller's, once that thread is gone)."""

    # OutStream.write returns None for a subprocess's write (ipykernel ignores the override too).
    def write(self, string: str) -> int | None:  # type: ignore[override]
        if not isinstance(string, str):  # untyped callers exist: ipykernel's own TypeError
            return super().write(string)  # type: ignore[unreachable]
        # One huge write (print of a 50 MB string) goes out in message-sized pieces too.
        for start in range(0, len(string), MESSAGE_CHARS):
            keep, notice, flush = self._admit(string[start : start + MESSAGE_CHARS])
            if keep:
                super().write(keep)
            if notice:
                super().write(
                    f"\n[kernelbridge: this cell wrote more than {CELL_CAP_CHARS >> 20} MiB to "
                    f"{self.name}; the rest is discarded]\n"
                )
            self._count_write()
            if flush:
                self.flush()
        return len(string)

    def flush(self) -> None:
        """Wait for what was written to be sent, as ipykernel's does, but not when everything
        written is sent already: ipykernel's hands a flush and an event to the IOPub thread and
        waits for that thread each time, and a cell's end calls it six times (stdout and stderr:
        after the display hook, before the reply, after the handler), most often with nothing
        written. That wait was a fifth of the kernel's time for a cell like ``1+1``."""
        if self._written != self._sent:  # a stale _sent only makes it wait as before
            super().flush()

    def _flush(self) -> None:
        # In the IOPub thread (or the caller's, when that thread is gone). What was written
        # before this point is in the buffers this send takes.
        upto = self._written
        super()._flush()
        self._sent = max(self._sent, upto)

    def _count_write(self) -> None:
        # Under a lock: two writers' increments must not lose one (a lost one could make a later
        # write look sent).
        with self._count_lock:
            self._written += 1

    def _admit(self, string: str) -> tuple[str, bool, bool]:
        """How much of ``string`` to keep, whether the cap was just reached, whether to flush."""
        parent = self.parent_header.get("msg_id") if isinstance(self.parent_header, dict) else None
        with self._cap_lock:
            if parent != self._cap_parent:
                self._cap_parent, self._cap_written, self._cap_unflushed = parent, 0, 0
                self._cap_noticed = False
            keep = string[: max(CELL_CAP_CHARS - self._cap_written, 0)]
            notice = len(keep) < len(string) and not self._cap_noticed
            self._cap_noticed = self._cap_noticed or notice
            self._cap_written += len(keep)
            self._cap_unflushed += len(keep)
            flush = self._cap_unflushed >= MESSAGE_CHARS
            if flush:
                self._cap_unflushed = 0
            return keep, notice, flush
