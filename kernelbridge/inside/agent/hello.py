"""The host's first frame: the ``hello`` and what the agent checks in it.

The first host's ``hello`` carries the kernel's HMAC key (never argv or the environment), the
agent hash the host expects (a host expecting another agent is refused: :class:`Refusal`), and,
for a sandbox that outlives its host, ``durable`` (:class:`Durable`: the sandbox's secret, its
idle timeout, its detached buffer). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AGENT_HASH_FILE = Path(__file__).parents[1] / "AGENT_HASH"
"""Written by the image builder (``kernelbridge/inside/AGENT_HASH``); absent outside an image."""
DETACHED_BUFFER = 32 * 1024 * 1024
"""What a durable sandbox holds for its next host by default (``hello.durable.buffer``)."""
MIN_BUFFER = 64 * 1024


@dataclass(frozen=True, slots=True)
class Durable:
    """What a durable ``hello`` asks for."""

    secret: str
    idle_timeout: float
    """Seconds the sandbox waits for a host once its host has gone; then it ends itself."""
    buffer: int = DETACHED_BUFFER

    @classmethod
    def from_hello(cls, raw: object) -> Durable | None:
        if not isinstance(raw, dict):
            return None
        secret, idle, buffer = raw.get("secret"), raw.get("idle_timeout"), raw.get("buffer")
        if not isinstance(secret, str) or len(secret) < 32 or not isinstance(idle, int | float):
            return None
        size = buffer if isinstance(buffer, int) and buffer >= MIN_BUFFER else DETACHED_BUFFER
        return cls(secret, max(float(idle), 1.0), size)


@dataclass(frozen=True, slots=True)
class Hello:
    """An accepted ``hello``."""

    key: bytes
    """The kernel's HMAC key."""
    durable: Durable | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why no host was accepted: the agent reports it in an ``exit`` frame and exits."""

    status: int
    """The agent's exit status."""
    kind: str
    """The ``exit`` frame's kind (``frames.EXIT_*``)."""
    reason: str


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
