"""The frame protocol between the host and the sandbox agent: a codec with no I/O.

Imported on both sides of the sandbox wall, by the host tunnel (``kernelbridge.tunnel``) and by the
agent inside the container (``kernelbridge.inside.agent``), so it depends on the standard library
only. A frame is one JSON object with a ``type`` on one UTF-8 line ending in ``\\n``.

Every line received is untrusted: :class:`FrameDecoder` never raises on bad input. A line that is
not a valid frame, or is past the caps, becomes a :class:`FrameError` (its strings clipped) that
the caller logs and drops, and decoding goes on with the next line.

The wire contract (frame types, fields, durable links, exit kinds, decoder rules): docs/design/frames.md.
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
FS_REQUEST = "fs_request"
FS_RESPONSE = "fs_response"
LAUNCH = "launch"
INTERRUPT = "interrupt"
RESTART = "restart"
SHUTDOWN = "shutdown"
EXIT = "exit"
LOG = "log"
# Durable links (sandboxes that outlive their bridge; docs/design/frames.md, "Durable links").
ACK = "ack"
DETACH = "detach"
CHALLENGE = "challenge"
ADOPTED = "adopted"
REFUSED = "refused"
RESUME = "resume"

FRAME_TYPES = frozenset(
    {
        HELLO, READY, KERNEL, RPC_REQUEST, RPC_RESPONSE, FS_REQUEST, FS_RESPONSE,
        INTERRUPT, RESTART, SHUTDOWN, EXIT, LOG, LAUNCH,
        ACK, DETACH, CHALLENGE, ADOPTED, REFUSED, RESUME,
    }
)  # fmt: skip

# Exit kinds (the ``kind`` of an ``exit`` frame).
EXIT_AGENT_MISMATCH = "agent_mismatch"
EXIT_IMAGE_MISSING = "image_missing"
EXIT_START_FAILED = "start_failed"
EXIT_START_TIMEOUT = "start_timeout"
EXIT_KERNEL_DIED = "kernel_died"
EXIT_OOM = "oom"
EXIT_CONTAINER_EXITED = "container_exited"
EXIT_SHUTDOWN = "shutdown"
EXIT_PROTOCOL = "protocol"
EXIT_PORTS_IN_USE = "ports_in_use"
CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})

HEARTBEAT = 5.0
"""Seconds between a host's ``ack`` frames at the latest, even when it has nothing new to ack."""
HOST_SILENCE = 30.0
"""A host of a durable sandbox that sent nothing for this long is gone (a stopped or wedged bridge
whose stdin never reaches EOF): the sandbox detaches it and may take another."""
HOST_ROLE = b"kernelbridge-adopt-host"
AGENT_ROLE = b"kernelbridge-adopt-agent"
NONCE_BYTES = 32
SECRET_BYTES = 32

# Why 48 MiB: a 32 MiB display payload must pass (the contract), with room for the message's
# JSON around it; every byte above that is memory a hostile sandbox could make the host hold per
# line, per session. Honest output leaves the kernel in messages of at most 1 MiB
# (inside/kernel/capped_outstream.py), so only single huge displays come near the cap.
MAX_FRAME_BYTES = 48 * 1024 * 1024
DEFAULT_MAX_FRAME_BYTES = MAX_FRAME_BYTES
# Why 64 levels and a million parts: Jupyter messages nest a handful of levels (a JSON display or
# widget state a few more). Deeper values are an attack: json.loads recurses and Python raises
# RecursionError past ~1000 levels, nbformat's schema validation fails far earlier, and a line of
# a million tiny lists costs seconds to walk on every hop.
MAX_DEPTH = 64
MAX_NODES = 1_000_000
# Strings from the sandbox that end up in logs, errors or events are clipped to this.
MAX_TEXT = 2000

# Host MCP calls (docs/rpc.md): 10 MB arguments and results must pass, with room for JSON escaping.
MAX_RPC_BYTES = 32 * 1024 * 1024
# Why 64: `asyncio.gather` of a few dozen calls is a normal fan-out; thousands in flight are a
# runaway loop or an attack, and each one holds host resources (a task, a pending answer).
MAX_RPC_IN_FLIGHT = 64

Frame = dict[str, Any]

DELIM = b"<IDS|MSG>"
MSG_PARTS = ("header", "parent_header", "metadata", "content")


HEAD_BYTES = 64
"""Bytes of an oversized line kept in its FrameError: enough to read ``{"type":...,"id":N`` and
answer the request it was (the rpc relay answers ``too_large``)."""


@dataclass(frozen=True, slots=True)
class FrameError:
    """A line that was not a valid frame. ``reason`` is one line, fit for a log."""

    reason: str
    size: int
    head: bytes = b""
    """The first HEAD_BYTES of an oversized line (empty otherwise)."""


def adoption_proof(secret: str, role: bytes, sandbox_nonce: str, host_nonce: str, frame: Frame) -> str:
    """HMAC-SHA256 under the sandbox's secret of ``role`` (:data:`HOST_ROLE` or :data:`AGENT_ROLE`),
    both nonces and ``frame`` but its ``proof`` (:func:`canonical`): what each end of an adoption
    shows the other, and the proof that no field of its frame was changed (docs/design/frames.md,
    "Durable links")."""
    message = b"\0".join((role, sandbox_nonce.encode(), host_nonce.encode(), canonical(frame)))
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def canonical(frame: Frame) -> bytes:
    """``frame`` without its ``proof`` as one byte string both ends compute alike: JSON with sorted
    keys, no spaces, ASCII only (what the sender signs and the receiver checks after decoding, so
    a float or an escape survives the trip; keys are strings, as JSON's are)."""
    signed = {key: value for key, value in frame.items() if key != "proof"}
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def proof_matches(expected: str, given: object) -> bool:
    """Whether ``given`` (untrusted) is ``expected``, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode()[:256])


def encode(frame: Frame) -> bytes:
    """Serialize one frame to a newline-terminated line.

    Raises ValueError if the frame has no known ``type``, TypeError if it is not JSON-serializable.
    """
    frame_type = frame.get("type")
    if frame_type not in FRAME_TYPES:
        raise ValueError(f"unknown frame type {frame_type!r}")
    text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        # A lone surrogate (JSON allows "\ud800" escapes; Python decodes them into strings that
        # UTF-8 cannot encode): escape everything instead, which JSON keeps lossless.
        return json.dumps(frame, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


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


def clip(text: object, limit: int = MAX_TEXT) -> str:
    """``str(text)`` cut to ``limit`` characters (with a marker): safe to log or store."""
    value = text if isinstance(text, str) else str(text)
    if len(value) <= limit:
        return value
    return value[:limit] + f"... [{len(value) - limit:,} characters cut]"


def shape_problem(value: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> str | None:
    """Why ``value`` (decoded JSON) is too deep or too big to handle, or None if it is fine.

    Iterative (an explicit stack), so checking a hostile value cannot itself recurse too deep.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            return f"more than {max_nodes:,} values"
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= max_depth and item:
            return f"nested deeper than {max_depth} levels"
        stack.extend((child, depth + 1) for child in children)
    return None


def value_estimate(line: bytes, plain: int) -> int:
    """An upper bound of the number of JSON values in ``line``, found without parsing it;
    ``plain``: its commas and brackets (:func:`_marks`).

    Why: ``json.loads`` builds every value before :func:`shape_problem` can count them, and
    values cost far more than their text: a 48 MiB line of ``[],`` is 16 million lists, 1.2 GB
    and 11 s of CPU. Every value but the first follows a ``,`` (or opens with ``[``/``{``), so
    counting those bytes bounds the values; that count is exact enough once the bytes inside
    strings are left out, which is done (still at C speed) only for lines where the plain count
    is over the limit (e.g. a big CSV text shown as one display) and that hold at most a quarter
    of MAX_NODES strings (so the split costs at most ~20 MB for a moment).
    """
    if plain <= MAX_NODES:
        return plain
    # Drop escaped backslashes, then escaped quotes: every '"' left delimits a string.
    cleaned = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = cleaned.count(b'"')
    if quotes // 2 > MAX_NODES // 4:
        return plain  # too many strings to set apart cheaply (the split below): the plain count stands
    outside = cleaned.split(b'"')[0::2]
    return quotes // 2 + sum(p.count(b",") + p.count(b"[") + p.count(b"{") for p in outside)


def parse_line(line: bytes) -> Frame | FrameError:
    """Decode one complete line (without its newline) into a frame, or say why it is not one."""
    size = len(line)
    openers, plain = _marks(line)
    if (values := value_estimate(line, plain)) > MAX_NODES:
        return FrameError(f"frame of about {values:,} values (more than {MAX_NODES:,})", size)
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        return FrameError(f"not JSON ({str(exc)[:80]})", size)
    except RecursionError:
        return FrameError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)", size)
    problem = shape_problem(value) if _may_be_misshapen(openers, plain) else None
    if problem is not None:
        return FrameError(f"frame {problem}", size)
    if not isinstance(value, dict):
        return FrameError(f"not a JSON object but {type(value).__name__}", size)
    frame_type = value.get("type")
    if frame_type not in FRAME_TYPES:
        return FrameError(f"unknown frame type {str(frame_type)[:40]!r}", size)
    if frame_type == KERNEL and not _is_kernel_frame(value):
        return FrameError("kernel frame without a valid channel and msg", size)
    return value


def _marks(line: bytes) -> tuple[int, int]:
    """The opening brackets of ``line``, and those with its commas (counted once, at C speed)."""
    openers = line.count(b"[") + line.count(b"{")
    return openers, openers + line.count(b",")


def _may_be_misshapen(
    openers: int, plain: int, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> bool:
    """Whether :func:`shape_problem` could find anything in the value of a line of ``openers``
    brackets and ``plain`` brackets and commas (:func:`_marks`). Not when there are fewer than
    ``max_depth`` brackets (no path nests that deep) and fewer than ``max_nodes`` brackets and
    commas (every value but the first follows one): the walk of each frame's values is then left
    out (most frames are a few hundred bytes)."""
    return openers >= max_depth or plain >= max_nodes


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
        self._head = b""

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
            self._head = _head(self._chunks, piece)
            self._chunks.clear()
            self._buffered = 0
            return
        self._chunks.append(piece)
        self._buffered += len(piece)

    def _finish_line(self) -> Frame | FrameError:
        if self._discarding:
            size, self._discarding = self._discarding, 0
            head, self._head = self._head, b""
            reason = f"frame of {size} bytes exceeds the {self.max_frame_bytes} byte cap"
            return FrameError(reason, size, head)
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


def _head(chunks: list[bytes], piece: bytes) -> bytes:
    head = b""
    for chunk in [*chunks, piece]:
        head += chunk[: HEAD_BYTES - len(head)]
        if len(head) >= HEAD_BYTES:
            break
    return head


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
    try:
        decoded = [json.loads(part) for part in body]  # ValueError on bad JSON
    except RecursionError:
        raise ValueError("a message part is nested too deeply") from None
    if not all(isinstance(part, dict) for part in decoded):
        raise ValueError("a message part is not a JSON object")
    return WireMessage(
        idents=parts[:split],
        signature=parts[split + 1],
        body=body,
        msg=dict(zip(MSG_PARTS, decoded, strict=True)),
        buffers=parts[split + 6 :],
    )
