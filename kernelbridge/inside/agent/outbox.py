"""The agent's frames for its host: in order, written as the host's stdout takes them, and, for a
sandbox that outlives its host, kept until the host acknowledges them.

Frame ``i`` of the queue is number ``acked + 1 + i`` (the first frame sent is 1). With ``retain`` (a
durable link) a frame is kept after it is written until an ``ack`` covers it, and
:meth:`Outbox.rewind` makes every unacknowledged frame unwritten again for the next host; without,
it is forgotten once written. :meth:`Outbox.trim` bounds the queue in bytes, oldest kernel output
first, counting every frame dropped; :meth:`Outbox.forget` drops what only the departed host could
use. A *preface* (``adopted``) is written before any queued frame and has no number. Pure
bookkeeping: the writes go through the function given to :meth:`Outbox.flush`. Why:
docs/design/sandbox.md.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

COALESCE_BYTES = 64 * 1024
"""Queued frames joined into one write, at most (a pipe takes 64 KiB at once)."""
Write = Callable[[memoryview], int]
"""``os.write`` on a non-blocking fd: writes a prefix, returns its length, raises BlockingIOError."""


class Kind(enum.Enum):
    """What a queued frame is, for what may be dropped and when."""

    OUTPUT = "output"
    """Kernel output (iopub streams and displays, the kernel's own log lines): dropped first."""
    RPC = "rpc"
    """The kernel's host call: only its host can answer it."""
    FS = "fs"
    """An answer to the host's file request: only that host asked."""
    OTHER = "other"


@dataclass(slots=True)
class Held:
    data: bytes
    kind: Kind
    tag: str | None = None
    """The execute_request this frame is the ``execute_reply`` of."""


class Outbox:
    """See the module docstring. ``retain``: keep frames until acknowledged (a durable link)."""

    def __init__(self, *, retain: bool = False) -> None:
        self.retain = retain
        self._frames: collections.deque[Held] = collections.deque()
        self.acked = 0
        """The sequence number of the last frame acknowledged (or, plain, written)."""
        self._next = 0
        """Index in the queue of the next frame to write ..."""
        self._offset = 0
        """... and how much of it was written."""
        self._preface = b""
        self.pending = 0
        """Bytes not written yet (preface included)."""
        self.held = 0
        """Bytes of every queued frame, written or not."""
        self.dropped_frames = 0
        self.dropped_bytes = 0

    def __repr__(self) -> str:
        return f"<Outbox {len(self._frames)} frames, {self.held} bytes held, {self.pending} unwritten>"

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def next_seq(self) -> int:
        """The sequence number of the first queued frame (what a new host is resent from)."""
        return self.acked + 1

    @property
    def unacked(self) -> int:
        """Bytes written and not acknowledged yet (the window in flight)."""
        return self.held - (self.pending - len(self._preface))

    def writable(self, *, frames: bool = True) -> bool:
        """Whether :meth:`flush` has anything to write (``frames``: queued frames count too)."""
        return bool(self._preface) or (frames and self._next < len(self._frames))

    def append(self, data: bytes, kind: Kind = Kind.OTHER, tag: str | None = None) -> None:
        self._frames.append(Held(data, kind, tag))
        self.pending += len(data)
        self.held += len(data)

    def preface(self, data: bytes) -> None:
        """Write ``data`` before anything queued, unnumbered (a handshake frame)."""
        self._preface += data
        self.pending += len(data)

    def flush(self, write: Write, *, frames: bool = True) -> None:
        """Write as much as ``write`` takes without blocking: the preface, then (``frames``)
        the queued frames. Raises what ``write`` raises besides BlockingIOError and
        InterruptedError (BrokenPipeError once the host is gone); what was not written stays."""
        try:
            while self._preface:
                written = write(memoryview(self._preface))
                self._preface = self._preface[written:]
                self.pending -= written
            while frames and self._next < len(self._frames):
                written = write(self._coalesced())
                self.pending -= written
                self._advance(written)
        except (BlockingIOError, InterruptedError):
            return

    def _coalesced(self) -> memoryview:
        """The rest of the next frame, joined with the small frames behind it (up to
        COALESCE_BYTES): one write for a burst of frames. A large frame goes alone, uncopied."""
        first = memoryview(self._frames[self._next].data)[self._offset :]
        pieces, size = [first], len(first)
        for index in range(self._next + 1, len(self._frames)):
            data = self._frames[index].data
            if size + len(data) > COALESCE_BYTES:
                break
            pieces.append(memoryview(data))
            size += len(data)
        return first if len(pieces) == 1 else memoryview(b"".join(pieces))

    def _advance(self, written: int) -> None:
        """``written`` more bytes of the queue are written: past each frame they complete."""
        while written:
            held = self._frames[self._next]
            taken = min(written, len(held.data) - self._offset)
            self._offset += taken
            written -= taken
            if self._offset < len(held.data):
                return
            self._offset = 0
            if self.retain:
                self._next += 1
            else:
                self._frames.popleft()
                self.held -= len(held.data)
                self.acked += 1

    def ack(self, seq: int) -> list[str]:
        """The host handled every frame up to ``seq``: forget them. Returns the tags among them.
        A sequence number the agent never sent (or one already acknowledged) changes nothing."""
        tags: list[str] = []
        written_up_to = self.acked + self._next
        seq = min(seq, written_up_to)  # a host cannot acknowledge what it was never sent
        while self.acked < seq and self._frames:
            held = self._frames.popleft()
            self.held -= len(held.data)
            self.acked += 1
            self._next -= 1
            if held.tag is not None:
                tags.append(held.tag)
        return tags

    def rewind(self) -> None:
        """The host went: everything it did not acknowledge is unwritten again, for the next one
        (a frame it got part of is sent whole). The preface of its handshake is dropped."""
        self.pending = self.held
        self._preface = b""
        self._next = 0
        self._offset = 0

    def forget(self, kinds: Iterable[Kind]) -> int:
        """Drop every queued frame of ``kinds`` (the host they were for is gone; the queue must be
        rewound). Returns how many."""
        drop = set(kinds)
        kept = collections.deque(held for held in self._frames if held.kind not in drop)
        gone = len(self._frames) - len(kept)
        self._replace(kept)
        return gone

    def trim(self, budget: int) -> None:
        """Keep the queue within ``budget`` bytes while no host is attached (it must be rewound):
        drop the oldest kernel output, then the oldest of anything, counting what goes."""
        if self.held <= budget:
            return
        excess = self.held - budget
        kept: collections.deque[Held] = collections.deque()
        for held in self._frames:  # the oldest output first
            if excess > 0 and held.kind is Kind.OUTPUT:
                excess -= len(held.data)
                self._count_drop(held)
            else:
                kept.append(held)
        while excess > 0 and kept:
            held = kept.popleft()
            excess -= len(held.data)
            self._count_drop(held)
        self._replace(kept)

    def _count_drop(self, held: Held) -> None:
        self.dropped_frames += 1
        self.dropped_bytes += len(held.data)

    def _replace(self, kept: collections.deque[Held]) -> None:
        self._frames = kept
        self.held = sum(len(held.data) for held in kept)
        self.pending = self.held + len(self._preface)
        self._next = 0
        self._offset = 0

    def take_dropped(self) -> tuple[int, int]:
        """Frames and bytes dropped since the last call (told to the next host)."""
        counts = (self.dropped_frames, self.dropped_bytes)
        self.dropped_frames = self.dropped_bytes = 0
        return counts

    def clear(self) -> None:
        """Forget everything (nobody will ever read it)."""
        self._frames.clear()
        self._preface = b""
        self.held = self.pending = self._next = self._offset = 0
