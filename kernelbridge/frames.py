"""The frame protocol between the host and the sandbox agent: a codec with no I/O.

This one module is imported on both sides of the sandbox wall: by the host tunnel
(``kernelbridge.tunnel``) and by the agent inside the container
(``kernelbridge.sandbox.agent``). It must therefore depend on the standard library only.

Wire layout
-----------
A frame is one JSON object on one line, UTF-8, terminated by ``\\n``. JSON escapes newlines
inside strings, so a frame can never contain a raw newline. Every frame has a ``type``:

=============  ===============  =====================================================================
type           direction        fields
=============  ===============  =====================================================================
hello          host -> sandbox  key (kernel HMAC key), session, agent_hash (expected), limits
ready          sandbox -> host  versions {python, ipykernel, agent}, agent_hash
kernel         both             channel (shell|control|stdin|iopub), msg {header, parent_header,
                                metadata, content}, buffers [base64 str]
rpc_request    sandbox -> host  id, method, params
rpc_response   host -> sandbox  id, result | error
interrupt      host -> sandbox  (none): SIGINT to the kernel process
restart        host -> sandbox  (none): replace the kernel, keep the container (answered by ready)
shutdown       host -> sandbox  (none): stop the kernel and exit
exit           sandbox -> host  status (kernel exit status; negative = signal), reason
log            sandbox -> host  level, message
=============  ===============  =====================================================================

Both ends also translate between ``kernel`` frames and the Jupyter wire protocol (ZMQ multipart:
routing ids, ``<IDS|MSG>``, HMAC signature, header, parent_header, metadata, content, buffers):
:func:`to_wire` and :func:`from_wire` are that translation, shared so the two ends cannot drift.

The receiving side treats every line as untrusted. :class:`FrameDecoder` never raises on bad
input: non-JSON, non-object, unknown ``type`` and oversized lines become :class:`FrameError`
values that the caller logs and drops, and decoding continues with the next line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

HELLO = "hello"
READY = "ready"
KERNEL = "kernel"
RPC_REQUEST = "rpc_request"
RPC_RESPONSE = "rpc_response"
INTERRUPT = "interrupt"
RESTART = "restart"
SHUTDOWN = "shutdown"
EXIT = "exit"
LOG = "log"

FRAME_TYPES = frozenset(
    {HELLO, READY, KERNEL, RPC_REQUEST, RPC_RESPONSE, INTERRUPT, RESTART, SHUTDOWN, EXIT, LOG}
)
CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})

# Why 128 MiB: a 32 MiB display payload must pass, and JSON escaping plus base64 of binary
# buffers can inflate a message by ~1.4x; 128 MiB leaves room while still bounding how much a
# hostile sandbox can make the host buffer for one line. The container's own memory limit
# (512 MiB by default) bounds what an honest kernel can produce in one message anyway.
DEFAULT_MAX_FRAME_BYTES = 128 * 1024 * 1024

# Host MCP calls (docs/rpc.md): 10 MB arguments and results must pass, with room for JSON escaping.
MAX_RPC_BYTES = 32 * 1024 * 1024
# Why 64: `asyncio.gather` of a few dozen calls is a normal fan-out; thousands in flight are a
# runaway loop or an attack, and each one holds host resources (a task, a pending answer).
MAX_RPC_IN_FLIGHT = 64

Frame = dict[str, Any]

DELIM = b"<IDS|MSG>"
MSG_PARTS = ("header", "parent_header", "metadata", "content")


@dataclass(frozen=True, slots=True)
class FrameError:
    """A line that was not a valid frame. ``reason`` is one line, fit for a log."""

    reason: str
    size: int


def encode(frame: Frame) -> bytes:
    """Serialize one frame to a newline-terminated line.

    Raises ValueError if the frame has no known ``type``, TypeError if it is not JSON-serializable.
    """
    frame_type = frame.get("type")
    if frame_type not in FRAME_TYPES:
        raise ValueError(f"unknown frame type {frame_type!r}")
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def kernel_frame(channel: str, msg: dict[str, Any], buffers: Iterable[bytes] = ()) -> Frame:
    """Build a ``kernel`` frame, base64-encoding the binary buffers."""
    frame: Frame = {"type": KERNEL, "channel": channel, "msg": msg}
    encoded = [base64.b64encode(bytes(b)).decode("ascii") for b in buffers]
    if encoded:
        frame["buffers"] = encoded
    return frame


def frame_buffers(frame: Frame) -> list[bytes]:
    """The binary buffers of a ``kernel`` frame. Raises ValueError on bad base64."""
    try:
        return [base64.b64decode(b, validate=True) for b in frame.get("buffers") or ()]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad buffer encoding: {exc}") from None


def parse_line(line: bytes) -> Frame | FrameError:
    """Decode one complete line (without its newline) into a frame, or say why it is not one."""
    size = len(line)
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        return FrameError(f"not JSON ({str(exc)[:80]})", size)
    if not isinstance(value, dict):
        return FrameError(f"not a JSON object but {type(value).__name__}", size)
    frame_type = value.get("type")
    if frame_type not in FRAME_TYPES:
        return FrameError(f"unknown frame type {str(frame_type)[:40]!r}", size)
    if frame_type == KERNEL and not _is_kernel_frame(value):
        return FrameError("kernel frame without a valid channel and msg", size)
    return value


def _is_kernel_frame(value: Frame) -> bool:
    msg = value.get("msg")
    return (
        value.get("channel") in CHANNELS
        and isinstance(msg, dict)
        and isinstance(msg.get("header"), dict)
        and isinstance(msg.get("content", {}), dict)
    )


class FrameDecoder:
    """Incremental decoder: feed it bytes as they arrive, get frames and errors back.

    Memory is bounded by ``max_frame_bytes``: a line that grows past it is discarded as it
    streams in (never buffered whole) and reported once as an oversized FrameError when its
    newline finally arrives.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._discarding = 0  # bytes of an oversized line dropped so far; 0 when not discarding

    def feed(self, data: bytes) -> list[Frame | FrameError]:
        """Consume ``data``; return every frame (or error) completed by it, in order."""
        results: list[Frame | FrameError] = []
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._keep(data[start:])
                return results
            self._keep(data[start:newline])
            start = newline + 1
            results.append(self._finish_line())

    def _keep(self, piece: bytes) -> None:
        if not piece:
            return
        if self._discarding:
            self._discarding += len(piece)
            return
        if self._buffered + len(piece) > self.max_frame_bytes:
            self._discarding = self._buffered + len(piece)
            self._chunks.clear()
            self._buffered = 0
            return
        self._chunks.append(piece)
        self._buffered += len(piece)

    def _finish_line(self) -> Frame | FrameError:
        if self._discarding:
            size, self._discarding = self._discarding, 0
            return FrameError(f"frame of {size} bytes exceeds the {self.max_frame_bytes} byte cap", size)
        line = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if not line.strip():
            return FrameError("empty line", 0)
        return parse_line(line)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished line held (or being discarded)."""
        return self._buffered or self._discarding


# -- the Jupyter wire protocol ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireMessage:
    """One multipart Jupyter message, split up. ``body`` is the four signed JSON parts."""

    idents: list[bytes]
    signature: bytes
    body: list[bytes]
    msg: dict[str, Any]
    buffers: list[bytes]


def sign(key: bytes, body: list[bytes]) -> bytes:
    """HMAC-SHA256 hex digest of the four JSON parts (empty key: no signing, as Jupyter does)."""
    if not key:
        return b""
    return hmac.new(key, b"".join(body), hashlib.sha256).hexdigest().encode()


def verify(key: bytes, message: WireMessage) -> bool:
    return not key or hmac.compare_digest(message.signature, sign(key, message.body))


def to_wire(msg: dict[str, Any], buffers: list[bytes], key: bytes) -> list[bytes]:
    """``[DELIM, signature, header, parent, metadata, content, *buffers]`` (prepend routing ids).

    Raises TypeError if the message is not JSON-serializable.
    """
    body = [json.dumps(msg.get(part) or {}).encode() for part in MSG_PARTS]
    return [DELIM, sign(key, body), *body, *buffers]


def from_wire(parts: list[bytes]) -> WireMessage:
    """Split a received multipart message. Raises ValueError if it is malformed."""
    if DELIM not in parts:
        raise ValueError("no <IDS|MSG> delimiter")
    split = parts.index(DELIM)
    if len(parts) < split + 6:
        raise ValueError("fewer than the six parts after the routing ids")
    body = parts[split + 2 : split + 6]
    decoded = [json.loads(part) for part in body]  # ValueError on bad JSON
    if not all(isinstance(part, dict) for part in decoded):
        raise ValueError("a message part is not a JSON object")
    return WireMessage(
        idents=parts[:split],
        signature=parts[split + 1],
        body=body,
        msg=dict(zip(MSG_PARTS, decoded, strict=True)),
        buffers=parts[split + 6 :],
    )
