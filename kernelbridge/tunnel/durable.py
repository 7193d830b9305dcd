"""The host's end of a durable link: a sandbox that outlives its bridge (docs/design/frames.md,
"Durable links").

The host acks the frames the tunnel has handled every :data:`ACK_FRAMES` frames or :data:`ACK_BYTES`
bytes at once, else after :data:`ACK_DELAY`, and at least every ``frames.HEARTBEAT`` seconds (the
sandbox takes silence for a host that has gone). An ``adopted`` frame comes from the sandbox:
:class:`Adoption` decodes it once, bounded, and :func:`check_adopted` refuses it in one line unless
its proof (``frames.adoption_proof``, a MAC under the secret over both nonces and every other field)
holds. The handshake: docs/architecture.md, "Sessions that outlive their bridge".
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from kernelbridge import frames

ACK_FRAMES = 256
ACK_BYTES = 1 << 20
ACK_DELAY = 0.2
"""Seconds an ack waits for more frames to cover: a busy sandbox is acked a few times a second."""
MAX_CELLS = 16
MAX_CODE = 16 * 1024


@dataclass(frozen=True, slots=True)
class Durability:
    secret: str = field(repr=False)
    idle_timeout: float
    """Seconds a detached sandbox waits for a bridge before it ends itself."""
    buffer: int
    """Bytes a detached sandbox holds for its next bridge."""
    adopting: bool = False
    """Reach a sandbox that already runs (its agent sends ``challenge``), rather than start one."""

    def hello_field(self) -> dict[str, Any]:
        """The ``durable`` field of a new sandbox's ``hello``."""
        return {"secret": self.secret, "idle_timeout": self.idle_timeout, "buffer": self.buffer}


class Acker:
    """Counts the sandbox's frames as the tunnel handles them (see the module docstring)."""

    def __init__(self, first: int = 1) -> None:
        self.handled = first - 1
        """The sequence number of the last frame handled."""
        self.acked = first - 1
        self._bytes = 0

    def rebase(self, first: int) -> None:
        """An adopted sandbox numbers what it resends from ``first``."""
        self.handled = self.acked = first - 1
        self._bytes = 0

    def count(self) -> None:
        """One more frame handled."""
        self.handled += 1

    def received(self, size: int) -> bool:
        """``size`` more bytes of frames read; True when an ack should go now."""
        self._bytes += size
        return self.handled - self.acked >= ACK_FRAMES or self._bytes >= ACK_BYTES

    @property
    def behind(self) -> bool:
        """Frames handled and not acknowledged yet."""
        return self.handled > self.acked

    def ack(self) -> frames.Frame:
        """The ``ack`` frame for everything handled so far."""
        self.acked = self.handled
        self._bytes = 0
        return {"type": frames.ACK, "seq": self.handled}


@dataclass(frozen=True, slots=True)
class InheritedCell:
    """A cell the bridge before sent, whose end it may not have heard (the agent's word)."""

    msg_id: str
    code: str
    status: str
    """``running``, or how it ended: ``ok``, ``error``, ``aborted``."""
    execution_count: int | None


@dataclass(frozen=True, slots=True)
class Adoption:
    """An ``adopted`` frame, decoded (every field checked and bounded: the sandbox is untrusted)."""

    next: int
    """The sequence number of the first frame it resends."""
    dropped_frames: int
    dropped_bytes: int
    """What it dropped past its buffer while no bridge was attached."""
    detached: float
    """Seconds it had no bridge."""
    idle: float
    """Seconds since a bridge last asked it anything (its last use)."""
    how: str | None
    """How its last bridge left (``detach``, ``eof``, ``broken``, ``silent``)."""
    cells: tuple[InheritedCell, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> Adoption:
        dropped = frame.get("dropped") if isinstance(frame.get("dropped"), dict) else {}
        assert isinstance(dropped, dict)
        raw_cells = frame.get("cells") if isinstance(frame.get("cells"), list) else []
        assert isinstance(raw_cells, list)
        cells = []
        for raw in raw_cells[:MAX_CELLS]:
            if not isinstance(raw, dict) or not isinstance(raw.get("msg_id"), str):
                continue
            code, status = raw.get("code"), raw.get("status")
            cells.append(
                InheritedCell(
                    frames.clip(raw["msg_id"], 200),
                    code[:MAX_CODE] if isinstance(code, str) else "",
                    status if status in ("running", "ok", "error", "aborted") else "running",
                    _count(raw.get("execution_count")),
                )
            )
        versions = frame.get("versions")
        how = frame.get("how")
        return cls(
            next=max(_count(frame.get("next")) or 1, 1),
            dropped_frames=_count(dropped.get("frames")) or 0,
            dropped_bytes=_count(dropped.get("bytes")) or 0,
            detached=_seconds(frame.get("detached")),
            idle=_seconds(frame.get("idle")),
            how=how if how in ("detach", "eof", "broken", "silent") else None,
            cells=tuple(cells),
            versions=(
                {frames.clip(k, 40): frames.clip(v, 80) for k, v in list(versions.items())[:20]}
                if isinstance(versions, dict)
                else {}
            ),
        )


@dataclass(frozen=True, slots=True)
class Handshake:
    """The host's answer to a challenge, and both nonces (to check the sandbox's answer with)."""

    hello: frames.Frame
    nonce: str
    host_nonce: str


def adoption_hello(
    durability: Durability, challenge: frames.Frame, session: str, agent_hash: str | None
) -> Handshake | str:
    """The ``hello`` that answers a ``challenge``, or why the challenge is not one."""
    nonce = challenge.get("nonce")
    if not isinstance(nonce, str) or not 16 <= len(nonce) <= 128:
        return "its challenge carries no nonce"
    host_nonce = secrets.token_hex(frames.NONCE_BYTES)
    hello: frames.Frame = {
        "type": frames.HELLO,
        "session": session,
        "agent_hash": agent_hash,
        "nonce": host_nonce,
    }
    hello["proof"] = frames.adoption_proof(durability.secret, frames.HOST_ROLE, nonce, host_nonce, hello)
    return Handshake(hello, nonce, host_nonce)


def check_adopted(durability: Durability, adopted: frames.Frame, handshake: Handshake) -> str | None:
    """None if the ``adopted`` frame is the sandbox's, as it sent it: its proof is the secret's MAC
    over both nonces and every fact in it. Else why not (one line, for ``AdoptionFailed``)."""
    expected = frames.adoption_proof(
        durability.secret, frames.AGENT_ROLE, handshake.nonce, handshake.host_nonce, adopted
    )
    if not frames.proof_matches(expected, adopted.get("proof")):
        return (
            "the sandbox is not the one this session made, or its answer was changed on the way"
            " (it is not signed with this session's secret over what it says)"
        )
    return None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _seconds(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return min(float(value), 10 * 365 * 86400.0)
    return 0.0
