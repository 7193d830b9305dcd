"""The agent's link to its host: frames in on stdin, frames out on stdout, and whether a host is there.

Everything the agent hears from or says to the host passes through :class:`HostLink`; nothing else
in the agent touches the container's stdio.

- **In.** The first frame must be the host's ``hello`` (:meth:`HostLink.accept_hello`: the kernel's
  HMAC key travels there, never in argv or the environment; a host expecting another agent is
  refused). Later frames are read from the raw fd when the poll loop says stdin is readable (no
  buffered reader, no thread), decoded with the frame codec and queued for the relay; a malformed
  host frame is logged and dropped.
- **Out.** Every frame is queued and written as stdout takes it, never blocking (why: below). A
  kernel frame over the host's frame cap is sent clipped (:func:`shrink_kernel_frame`), and log
  frames are rate-limited (:meth:`HostLink.log`): kernel code can write to its own fd 1/2 without
  end, and the host must not turn that into a log flood.
- **State** (:class:`LinkState`, in ``repr``): awaiting the hello, attached to the host that sent
  it, or ended. A host leaving (stdin at EOF, or stdout broken) reaches one method,
  :meth:`HostLink._host_left`, which decides what that means; the relay only asks :attr:`ended`,
  :attr:`backlogged` and the ``wants_*`` properties.

**Why writes never block.** The host reads the agent's stdout and writes its stdin, and both
directions have bounded buffers. An agent blocked writing stdout no longer reads stdin; if the host
is at that moment blocked writing stdin (answering a burst of the kernel's host calls, say),
neither side moves again: a deadlock. So writes are non-blocking into a queue, stdin is always
read, and while the queue holds more than :data:`HIGH_WATER` bytes the link is
:attr:`~HostLink.backlogged`: the relay stops reading from the kernel (its messages, its output,
its rpc socket) until the host has taken the backlog. Backpressure reaches the kernel, never the
host's own frames. Outside the relay loop (start-up, exit) nothing polls stdout, so there
:meth:`~HostLink.send` waits, bounded by :data:`OUTPUT_DRAIN_TIMEOUT`, until its frame is written.

**Detaching (issue 15) plugs in here.** Today a host is attached for the container's life, so
:meth:`HostLink._host_left` ends the link and the agent stops. For sessions that outlive their
bridge it goes to a new ``DETACHED`` state instead: :meth:`~HostLink.send` keeps frames in the
outbox up to a byte bound without writing (dropping and counting past it) and :attr:`backlogged`
stays false so the kernel runs on; :attr:`wants_read` stays true, and a new host's ``hello``, which
:meth:`~HostLink.receive` already keeps from the relay, goes through the same check as the first
(plus the per-session secret) and re-attaches, the backlog written first; an idle timeout in
``DETACHED`` ends the link. The relay stops only on :attr:`ended` and needs no change. What says
that a host has gone also belongs here: EOF today; under an engine that keeps the container's
stdin open across attaches, a ``detach`` frame or a silent host.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import select
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelbridge import frames
from kernelbridge.inside.agent.write_queue import WriteQueue

AGENT_HASH_FILE = Path(__file__).parents[1] / "AGENT_HASH"
"""Written by the image builder (``kernelbridge/inside/AGENT_HASH``); absent outside an image."""
HELLO_TIMEOUT = 30.0
OUTPUT_DRAIN_TIMEOUT = 10.0
"""Bound on waiting for the host to read a frame outside the relay loop (start-up, exit)."""
HIGH_WATER = 8 * 1024 * 1024
"""Queued bytes past which the link is backlogged. One frame may exceed it (a 32 MiB display);
the queue then holds that frame and nothing more."""
READ_CHUNK = 1 << 20
MAX_LOG_LINE = 2000
# Why 200 lines per 10 s: the kernel's own fd 1/2 (C extensions, os.write) becomes log frames, and
# kernel code can write there without end; the host must not turn that into a log flood.
LOG_BURST = 200
LOG_WINDOW = 10.0
CLIP_STRING = 1024 * 1024
"""Strings of a kernel message longer than this are cut when the message is over the frame cap."""


class LinkState(enum.Enum):
    AWAITING_HELLO = "awaiting hello"
    """Started: the first frame must be the host's ``hello``."""
    ATTACHED = "attached"
    """A host's hello was accepted: its frames go to the relay, the agent's frames go to it."""
    ENDED = "ended"
    """The host has gone and none will come again: the agent stops."""


class Writes(enum.Enum):
    """How :meth:`HostLink.send` writes."""

    WAIT = "wait"
    """Until the frame is written (bounded): no loop polls stdout (start-up, exit)."""
    POLLED = "polled"
    """Queue only: the relay loop writes as stdout takes it (:meth:`HostLink.polled`)."""


@dataclass(frozen=True, slots=True)
class Hello:
    """An accepted ``hello``."""

    key: bytes
    """The kernel's HMAC key."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why no host was accepted: the agent reports it in an ``exit`` frame and exits."""

    status: int
    """The agent's exit status."""
    kind: str
    """The ``exit`` frame's kind (``frames.EXIT_*``)."""
    reason: str


class HostLink:
    """The container's stdin (``input_fd``) and stdout (``output_fd``) as frames.

    ``clock`` drives the log rate window only (tests pass a fake one); I/O deadlines use the real
    monotonic clock.
    """

    def __init__(self, input_fd: int, output_fd: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.input_fd = input_fd
        self.output_fd = output_fd
        os.set_blocking(output_fd, False)
        self.state = LinkState.AWAITING_HELLO
        self._writes = Writes.WAIT
        self._outbox = WriteQueue(functools.partial(os.write, output_fd))
        self._output_broken = False
        self._decoder = frames.FrameDecoder()
        self._incoming: deque[frames.Frame] = deque()
        self._clock = clock
        self._log_window_start = clock()
        self._log_count = 0
        self._log_suppressed = 0

    def __repr__(self) -> str:
        return (
            f"<HostLink {self.state.value}, {self._writes.value} writes, {self._outbox.pending} bytes"
            f" out, {len(self._incoming)} frames in>"
        )

    # -- what the relay asks each turn -----------------------------------------------------------
    @property
    def ended(self) -> bool:
        """No host will send or read anything any more: stop everything."""
        return self.state is LinkState.ENDED

    @property
    def backlogged(self) -> bool:
        """The host has not taken what is queued: stop reading from the kernel until it has."""
        return self._outbox.pending > HIGH_WATER

    @property
    def wants_read(self) -> bool:
        """Whether stdin should be polled for reading."""
        return self.state is not LinkState.ENDED

    @property
    def wants_write(self) -> bool:
        """Whether stdout should be polled for writing (something is queued)."""
        return self._outbox.pending > 0

    # -- in ----------------------------------------------------------------------------------------
    def accept_hello(self, timeout: float = HELLO_TIMEOUT) -> Hello | Refusal:
        """Wait for the first frame, which must be ``hello``, and check it. Frames behind it stay
        queued for :meth:`receive`."""
        deadline = time.monotonic() + timeout
        while not self._incoming and self.state is not LinkState.ENDED:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.input_fd], [], [], remaining)[0]:
                break
            self.read()
        frame = self._incoming.popleft() if self._incoming else None
        if frame is None or frame["type"] != frames.HELLO:
            return Refusal(2, frames.EXIT_START_FAILED, f"no valid hello frame on stdin within {timeout:g} s")
        mismatch = check_agent_hash(frame.get("agent_hash"))
        if mismatch:
            return Refusal(3, frames.EXIT_AGENT_MISMATCH, mismatch)
        self.state = LinkState.ATTACHED
        return Hello(key=str(frame.get("key", "")).encode())

    def read(self) -> None:
        """Decode what stdin has now into the incoming queue (when the poller says it is readable,
        or while waiting for the hello)."""
        try:
            chunk = os.read(self.input_fd, READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            self._host_left()
            return
        for item in self._decoder.feed(chunk):
            if isinstance(item, frames.FrameError):
                self.log(f"dropped host frame: {item.reason}", "warning")
            else:
                self._incoming.append(item)

    def receive(self) -> frames.Frame | None:
        """The next host frame for the relay, oldest first; None when none is queued.

        Frames about the link itself stay here: a host attached for the container's life sends
        one ``hello``, so a later one is ignored (issue 15: the re-attach of a new host)."""
        while self._incoming:
            frame = self._incoming.popleft()
            if frame["type"] != frames.HELLO:
                return frame
            self.log(f"ignored {frame['type']} frame", "debug")
        return None

    def _host_left(self, output_broken: bool = False) -> None:
        """The host has gone: stdin reached EOF, or stdout is broken (``output_broken``).

        The ONE place that decides what that means. Today a host is attached for the container's
        life, so the link ends and the agent stops: after stdin's EOF the frames already queued are
        still relayed (a ``shutdown`` just before the EOF is answered) and output is still written
        while stdout takes it; a broken stdout drops both ways at once, as nobody hears the answers.
        Issue 15 goes to a DETACHED state here instead (see the module docstring)."""
        if output_broken:
            self._output_broken = True
            self._outbox.clear()
            self._incoming.clear()
        self.state = LinkState.ENDED

    # -- out ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def polled(self) -> Iterator[None]:
        """While inside, the relay loop polls stdin and stdout: stdin is non-blocking and
        :meth:`send` only queues (:data:`Writes.POLLED`)."""
        os.set_blocking(self.input_fd, False)
        self._writes = Writes.POLLED
        try:
            yield
        finally:
            self._writes = Writes.WAIT

    def send(self, frame: frames.Frame) -> None:
        """Queue a frame for the host and write what stdout takes now; with :data:`Writes.WAIT`,
        wait (bounded) until it is written. A kernel frame over the frame cap is clipped; one still
        over it is dropped with a warning. Nothing is sent once stdout is broken."""
        if self._output_broken:
            return
        data = frames.encode(frame)
        if len(data) > frames.MAX_FRAME_BYTES and frame["type"] == frames.KERNEL:
            # The host drops a frame over its cap, and a dropped reply leaves a cell hanging until
            # its timeout (e.g. an exception whose message is a 30 MiB repr): send it clipped.
            shrunk = frames.encode(shrink_kernel_frame(frame))
            if len(shrunk) > frames.MAX_FRAME_BYTES:
                self.log(f"dropped a kernel message of {len(data):,} bytes: over the frame cap", "warning")
                return
            data = shrunk
        self._outbox.append(data)
        self.flush()
        if self._writes is Writes.WAIT:
            self.drain(OUTPUT_DRAIN_TIMEOUT)

    def log(self, message: str, level: str = "info") -> None:
        """A log frame for the host, rate-limited: past LOG_BURST lines in a window the rest are
        counted and reported once when the window ends."""
        now = self._clock()
        if now - self._log_window_start > LOG_WINDOW:
            if self._log_suppressed:
                suppressed, self._log_suppressed = self._log_suppressed, 0
                self.send(
                    {"type": frames.LOG, "level": "warning", "message": f"{suppressed} log lines suppressed"}
                )
            self._log_window_start, self._log_count = now, 0
        self._log_count += 1
        if self._log_count > LOG_BURST:
            self._log_suppressed += 1
            return
        self.send({"type": frames.LOG, "level": level, "message": message[:MAX_LOG_LINE]})

    def send_exit(self, status: int | None, kind: str, reason: str) -> None:
        self.send({"type": frames.EXIT, "status": status, "kind": kind, "reason": reason})

    def flush(self) -> None:
        """Write as much of the queue as stdout takes without blocking (when the poller says it is
        writable). A broken stdout means the host has gone."""
        try:
            self._outbox.flush()
        except BrokenPipeError:
            self._host_left(output_broken=True)

    def drain(self, timeout: float) -> bool:
        """Wait until everything queued is written or ``timeout`` passes (outside the relay loop:
        at start-up and on exit). Returns whether the queue is empty."""
        deadline = time.monotonic() + timeout
        while self._outbox.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([], [self.output_fd], [], left)
            self.flush()
        return True


def baked_agent_hash() -> str | None:
    """The agent hash the image builder wrote beside this package (None outside an image)."""
    return AGENT_HASH_FILE.read_text().strip() if AGENT_HASH_FILE.exists() else None


def check_agent_hash(expected: object) -> str | None:
    """None if this agent is the one the host expects (or it expects none), else why not."""
    baked = baked_agent_hash() or "unknown"
    if expected and expected != baked:
        return (
            f"the sandbox image carries agent {baked[:12]} but this kernelbridge "
            f"expects {str(expected)[:12]}; rebuild it with `kernelbridge image build`"
        )
    return None


def shrink_kernel_frame(frame: frames.Frame) -> frames.Frame:
    """``frame`` with every string of its message cut to CLIP_STRING and its buffers dropped."""
    return frames.kernel_frame(frame["channel"], _clipped(frame["msg"], 0))


def _clipped(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        if len(value) <= CLIP_STRING:
            return value
        return value[:CLIP_STRING] + f"... [{len(value) - CLIP_STRING:,} characters cut by kernelbridge]"
    if depth > frames.MAX_DEPTH:
        return None
    if isinstance(value, dict):
        return {key: _clipped(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_clipped(item, depth + 1) for item in value]
    return value
