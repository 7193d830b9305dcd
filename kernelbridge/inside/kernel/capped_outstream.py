"""The kernel's stdout/stderr inside the sandbox: ipykernel's OutStream with bounded messages.

Problem: ipykernel batches everything a cell writes in 0.2 s into one iopub message. A loop that
prints 200 MB produces messages of a hundred megabytes, each copied several times on its way out
(buffer, JSON, ZMQ, the agent's frame), and the 512 MiB sandbox is OOM-killed: the user loses
every variable for printing too much. Nobody can read that much output anyway; the bridge shows
a model 20,000 characters of it.

Approach, installed with ``--IPKernelApp.outstream_class`` (a documented ipykernel setting):

- once ``MESSAGE_CHARS`` are buffered, flush and wait for the send: messages stay small and the
  writing cell is slowed to the speed at which output leaves the kernel;
- past ``CELL_CAP_CHARS`` of one request's output, the rest is discarded, with one notice.

The cap is per request (the parent msg_id), per stream. 32 MiB of output (the tunnel's contract)
passes whole.
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
            if flush:
                self.flush()
        return len(string)

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
