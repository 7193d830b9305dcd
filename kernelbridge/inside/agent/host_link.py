"""The agent's link to its host: frames in on stdin, frames out on stdout, and whether a host is there.

Nothing else in the agent touches the container's stdio. The first frame must be the host's
``hello`` (the kernel's key travels there, never in argv or the environment); a malformed host frame
is logged and dropped; a kernel frame over the frame cap is sent clipped; log frames are
rate-limited. Writes never block: past :data:`HIGH_WATER` queued bytes the link is
:attr:`~HostLink.backlogged` and the relay stops reading the kernel; outside the relay loop
:meth:`~HostLink.send` waits, bounded by :data:`OUTPUT_DRAIN_TIMEOUT`. A host leaving ends a plain
link; a durable one detaches and keeps its frames for the next host. Its state is a
:class:`LinkState` (``state.py``). Why: docs/design/sandbox.md.
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
from typing import Any

from kernelbridge import frames
from kernelbridge.inside.agent.adoption import Handover
from kernelbridge.inside.agent.hello import Durable, Hello, Refusal, check_agent_hash
from kernelbridge.inside.agent.host_cells import HostCells
from kernelbridge.inside.agent.outbox import Kind, Outbox
from kernelbridge.inside.agent.state import LinkChange, LinkState, next_link_state

HELLO_TIMEOUT = 30.0
OUTPUT_DRAIN_TIMEOUT = 10.0
"""Bound on waiting for the host to read a frame outside the relay loop (start-up, exit)."""
HIGH_WATER = 8 * 1024 * 1024
"""Queued bytes past which the link is backlogged. One frame may exceed it (a 32 MiB display);
the queue then holds that frame and nothing more."""
WINDOW = 32 * 1024 * 1024
"""Bytes a durable link keeps written but not acknowledged before it is backlogged too (the host
acks every megabyte or so: only a host that stopped acking reaches this)."""
READ_CHUNK = 1 << 20
MAX_LOG_LINE = 2000
# Why 200 lines per 10 s: the kernel's own fd 1/2 (C extensions, os.write) becomes log frames, and
# kernel code can write there without end; the host must not turn that into a log flood.
LOG_BURST = 200
LOG_WINDOW = 10.0
CLIP_STRING = 1024 * 1024
"""Strings of a kernel message longer than this are cut when the message is over the frame cap."""
OUTPUT_MESSAGES = frozenset({"stream", "display_data", "update_display_data", "clear_output"})
"""iopub messages that are output only: the first to go when a detached sandbox's buffer is full."""
LINK_FRAMES = frozenset({frames.HELLO, frames.ACK, frames.DETACH, frames.RESUME})
"""Host frames about the link itself: handled here, never passed to the relay."""


class Writes(enum.Enum):
    """How :meth:`HostLink.send` writes."""

    WAIT = "wait"
    """Until the frame is written (bounded): no loop polls stdout (start-up, exit)."""
    POLLED = "polled"
    """Queue only: the relay loop writes as stdout takes it (:meth:`HostLink.polled`)."""


class Departure(enum.Enum):
    """How the last host went away (told to the next one)."""

    DETACHED = "detach"
    """It said so (a bridge that exited cleanly)."""
    EOF = "eof"
    """Its stdin reached EOF without a word (a bridge that was killed, or its client)."""
    BROKEN = "broken"
    """Its stdout broke."""
    SILENT = "silent"
    """It sent nothing for ``frames.HOST_SILENCE`` seconds (a stopped or wedged bridge)."""


class HostLink:
    """The host's stdin (``input_fd``) and stdout (``output_fd``) as frames: the container's own,
    and for a durable sandbox later a handover's.

    ``clock`` drives the log rate window and the durable link's timers (tests pass a fake one);
    the hello's and the drain's deadlines use the real monotonic clock.
    """

    def __init__(self, input_fd: int, output_fd: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.input_fd = input_fd
        self.output_fd = output_fd
        os.set_blocking(output_fd, False)
        self.state = LinkState.AWAITING_HELLO
        self.durable: Durable | None = None
        self.cells = HostCells()
        self._writes = Writes.WAIT
        self._outbox = Outbox()
        self._output_broken = False
        self._decoder = frames.FrameDecoder()
        self._incoming: deque[frames.Frame] = deque()
        self._clock = clock
        self._log_window_start = clock()
        self._log_count = 0
        self._log_suppressed = 0
        self._handover: Handover | None = None
        """The current host's handover (None: the container's own stdio)."""
        self._paused = False
        """An adopted host has not said ``resume`` yet: only the handshake is written."""
        self.heard = clock()
        """When the host last sent anything (its acks are its heartbeat)."""
        self.used = clock()
        """When the host last sent something other than an ack: the sandbox's last use."""
        self.detached_at: float | None = None
        self.departure: Departure | None = None
        self.departures = 0
        """How many hosts have gone (the relay answers the kernel's pending host calls each time)."""

    def __repr__(self) -> str:
        return (
            f"<HostLink {self.state.value}, {self._writes.value} writes, {self._outbox.pending} bytes"
            f" out, {len(self._incoming)} frames in>"
        )

    def _change(self, change: LinkChange) -> LinkState:
        """The one place the state changes. Raises IllegalTransition (a bug) for a forbidden pair."""
        self.state = next_link_state(self.state, change)
        return self.state

    # -- what the relay asks each turn -----------------------------------------------------------
    @property
    def ended(self) -> bool:
        """No host will send or read anything any more: stop everything."""
        return self.state is LinkState.ENDED

    @property
    def attached(self) -> bool:
        return self.state is LinkState.ATTACHED

    @property
    def backlogged(self) -> bool:
        """The host has not taken (or, durable, acknowledged) what is queued: stop reading from
        the kernel until it has. Never while detached: the kernel runs on."""
        if self.state is LinkState.DETACHED:
            return False
        return self._outbox.pending > HIGH_WATER or self._outbox.unacked > WINDOW

    @property
    def wants_read(self) -> bool:
        """Whether the host's stdin should be polled for reading."""
        return self.state in (LinkState.AWAITING_HELLO, LinkState.ATTACHED)

    @property
    def wants_write(self) -> bool:
        """Whether the host's stdout should be polled for writing (something is to be written)."""
        return self._can_write() and self._outbox.writable(frames=not self._paused)

    def _can_write(self) -> bool:
        return self.state is not LinkState.DETACHED and self.output_fd >= 0 and not self._output_broken

    @property
    def held(self) -> int:
        """Bytes queued for the host (written or not)."""
        return self._outbox.held

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
            return Refusal(2, frames.EXIT_START_FAILED, self._no_hello(frame, timeout))
        mismatch = check_agent_hash(frame.get("agent_hash"))
        if mismatch:
            return Refusal(3, frames.EXIT_AGENT_MISMATCH, mismatch)
        self._change(LinkChange.HELLO)
        self.durable = Durable.from_hello(frame.get("durable"))
        self._outbox.retain = self.durable is not None
        self.heard = self.used = self._clock()
        return Hello(key=str(frame.get("key", "")).encode(), durable=self.durable)

    def _no_hello(self, first: frames.Frame | None, timeout: float) -> str:
        """Why the start failed without a hello: the host sent something else, closed stdin, or
        said nothing in time (three causes a person fixes differently)."""
        if first is not None:
            return f"the host's first frame on stdin was {str(first['type'])[:40]!r}, not hello"
        if self.state is LinkState.ENDED:
            return "the host closed stdin before sending its hello frame"
        return f"no hello frame on stdin within {timeout:g} s"

    def read(self) -> None:
        """Decode what the host's stdin has now into the incoming queue (when the poller says it
        is readable, or while waiting for the hello)."""
        try:
            chunk = os.read(self.input_fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._host_left(Departure.EOF)
            return
        self.heard = self._clock()
        for item in self._decoder.feed(chunk):
            if isinstance(item, frames.FrameError):
                self.log(f"dropped host frame: {item.reason}", "warning")
            else:
                self._incoming.append(item)

    def receive(self) -> frames.Frame | None:
        """The next host frame for the relay, oldest first; None when none is queued.

        Frames about the link itself stay here (:data:`LINK_FRAMES`): acknowledgements, a
        ``detach``, an adopted host's ``resume``; a host's later ``hello`` is ignored."""
        while self._incoming:
            frame = self._incoming.popleft()
            kind = frame["type"]
            if kind not in LINK_FRAMES:
                self.used = self._clock()
                if kind == frames.KERNEL and frame.get("channel") == "shell":
                    self.cells.sent(frame["msg"])
                return frame
            if kind in (frames.ACK, frames.DETACH):
                self._ack(frame.get("seq"))
                if kind == frames.DETACH:
                    self._host_left(Departure.DETACHED)
            elif kind == frames.RESUME:
                self._paused = False
            else:
                self.log(f"ignored {kind} frame", "debug")
        return None

    def _ack(self, seq: object) -> None:
        if isinstance(seq, int) and not isinstance(seq, bool) and self.durable is not None:
            self.cells.heard(self._outbox.ack(seq))

    def check(self, now: float) -> None:
        """Timers (each turn of the relay loop): a durable host silent past ``HOST_SILENCE`` has
        gone; a sandbox detached for longer than its idle timeout ends."""
        if self.durable is None:
            return
        if self.state is LinkState.ATTACHED and now - self.heard > frames.HOST_SILENCE:
            self._host_left(Departure.SILENT)
        elif (
            self.state is LinkState.DETACHED
            and self.detached_at is not None
            and now - self.detached_at > self.durable.idle_timeout
        ):
            self._change(LinkChange.EXPIRE)

    def _host_left(self, how: Departure, output_broken: bool = False) -> None:
        """The host has gone: ``how`` says in which way. The ONE place that decides what that means.

        A plain link ends and the agent stops: after stdin's EOF the frames already queued are
        still relayed (a ``shutdown`` just before the EOF is answered) and output is still written
        while stdout takes it; a broken stdout drops both ways at once, as nobody hears the answers.
        A durable link detaches (docs/architecture.md, "Durable link"): nothing more is written to this
        host's pipes, its queued frames are still acted on (their answers wait for the next host)."""
        durable, before = self.durable, self.state
        if self._change(LinkChange.LEAVE if durable is None else LinkChange.DETACH) is before:
            return  # it had already gone
        if durable is None:
            if output_broken:
                self._output_broken = True
                self._outbox.clear()
                self._incoming.clear()
            return
        self.detached_at = self._clock()
        self.departure = how
        self.departures += 1
        self._paused = False
        self._release_pipes()
        self._outbox.rewind()
        self._outbox.forget((Kind.RPC, Kind.FS))  # only the host that left could answer or use them
        self._outbox.trim(durable.buffer)

    def _release_pipes(self) -> None:
        """Stop using the current host's pipes: a handover's are closed (its process exits with
        the connection), the container's own stdio is pointed at /dev/null (fds 0 and 1 stay
        taken, so no later fd lands there)."""
        if self._handover is not None:
            self._handover.close()
            self._handover = None
        else:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (self.input_fd, self.output_fd):
                with contextlib.suppress(OSError):
                    os.dup2(null, fd)
            os.close(null)
        self._decoder = frames.FrameDecoder()
        self.input_fd = self.output_fd = -1

    def attach(self, handover: Handover, adopted: frames.Frame) -> None:
        """A host that proved itself (``adoption.py``) on ``handover``'s pipes: write ``adopted``
        first, hold the rest back until it says ``resume``."""
        assert self.durable is not None
        self._change(LinkChange.ADOPT)
        self._handover = handover
        self.input_fd, self.output_fd = handover.input_fd, handover.output_fd
        self._output_broken = False
        self._paused = True
        self.heard = self._clock()
        self.detached_at = None
        self._outbox.preface(frames.encode(adopted))
        self.flush()

    def adoption_facts(self) -> dict[str, Any]:
        """What the ``adopted`` frame tells a new host about the time without one."""
        now = self._clock()
        dropped_frames, dropped_bytes = self._outbox.take_dropped()
        return {
            "next": self._outbox.next_seq,
            "dropped": {"frames": dropped_frames, "bytes": dropped_bytes},
            "detached": round(now - self.detached_at, 3) if self.detached_at is not None else 0.0,
            "idle": round(now - self.used, 3),
            "how": self.departure.value if self.departure is not None else None,
            "cells": self.cells.inherit(),
        }

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
        """Queue a frame for the host; with :data:`Writes.WAIT`, write it and wait (bounded)
        until it is written, else the relay loop writes it (:meth:`flush`, once a turn: the
        frames of one turn go out in one write, and one wake-up of every relay on the way). A
        kernel frame over the frame cap is clipped; one still over it is dropped with a warning.
        Nothing is sent once stdout is broken. While detached the frame is kept for the next
        host, within the buffer."""
        if self._output_broken or (self.state is LinkState.ENDED and self.durable is not None):
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
        kind, tag = self._classify(frame)
        self._outbox.append(data, kind, tag)
        if self.state is LinkState.DETACHED:
            assert self.durable is not None
            self._outbox.trim(self.durable.buffer)
            return
        if self._writes is Writes.WAIT:
            self.flush()
            self.drain(OUTPUT_DRAIN_TIMEOUT)

    def _classify(self, frame: frames.Frame) -> tuple[Kind, str | None]:
        kind = frame["type"]
        if kind == frames.LOG:
            return Kind.OUTPUT, None
        if kind == frames.RPC_REQUEST:
            return Kind.RPC, None
        if kind == frames.FS_RESPONSE:
            return Kind.FS, None
        if kind == frames.KERNEL:
            msg = frame["msg"]
            if frame["channel"] == "iopub" and msg["header"].get("msg_type") in OUTPUT_MESSAGES:
                return Kind.OUTPUT, None
            if frame["channel"] == "shell":
                return Kind.OTHER, self.cells.replied(msg)
        return Kind.OTHER, None

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
        if not self._can_write():
            return
        try:
            self._outbox.flush(functools.partial(os.write, self.output_fd), frames=not self._paused)
        except OSError:  # BrokenPipeError, or a handover pipe that failed
            self._host_left(Departure.BROKEN, output_broken=True)

    def drain(self, timeout: float) -> bool:
        """Wait until everything queued is written or ``timeout`` passes (outside the relay loop:
        at start-up and on exit). Returns whether the queue is empty. Nothing is written while
        detached (the frames wait for a host that will not come: the agent is leaving)."""
        deadline = time.monotonic() + timeout
        while self.wants_write:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([], [self.output_fd], [], left)
            self.flush()
        return not self._outbox.pending


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
