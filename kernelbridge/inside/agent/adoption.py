"""A new host for a sandbox that outlived its old one: the attach point, the handover, the challenge.

The agent binds its abstract socket (:class:`AttachPoint`) before the kernel exists and keeps it for
its life. A :class:`Handover` (an exec session's stdin and stdout) is taken only from the relay uid
(``SO_PEERCRED``): any other peer, kernel code included, is hung up on before a byte is read. One
:class:`Candidate` at a time (a newer one replaces one silent since its challenge) must answer the
``challenge`` within :data:`CANDIDATE_TIMEOUT` with a ``hello`` whose ``proof`` is
``adoption_proof(secret, HOST_ROLE, nonce, host nonce, hello)``; anything else (garbage, another
frame, a wrong or replayed proof, :data:`MAX_CANDIDATE_BYTES` without a hello) is ``refused``, and so
is a proven candidate while a live host is attached. The verdict is a value (:class:`Accepted` or
:class:`Rejected`). Standard library and ``kernelbridge.frames`` only.
"""

from __future__ import annotations

import array
import contextlib
import os
import secrets
import socket
import struct
import time
from dataclasses import dataclass

from kernelbridge import frames
from kernelbridge.inside.handover import DEFAULT_SOCKET, RELAY_UID, SOCKET_ENV, socket_address

RELAY_UID_ENV = "KERNELBRIDGE_RELAY_UID"
"""The uid a handover must run as (``handover.RELAY_UID``; the local test double sets its own)."""
CANDIDATE_TIMEOUT = 10.0
MAX_CANDIDATE_BYTES = 64 * 1024
"""A hello is a few hundred bytes; more before one is not a host."""
BACKLOG = 8
MAX_ACCEPTS = 32
"""Connections taken per turn of the loop: a backlog filled by kernel code is drained, bounded."""


@dataclass(slots=True)
class Handover:
    """The stdio of an exec session, passed by the handover process, and its connection (closed
    when the attachment ends: the handover process then exits, and its exec session with it)."""

    conn: socket.socket
    input_fd: int
    output_fd: int

    def close(self) -> None:
        for fd in (self.input_fd, self.output_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            self.conn.close()


class AttachPoint:
    """The abstract socket handovers connect to. ``relay_uid``: the only uid accepted."""

    def __init__(self, name: str | None = None, relay_uid: int | None = None) -> None:
        self.name = name or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        if relay_uid is None:
            relay_uid = int(os.environ.get(RELAY_UID_ENV) or RELAY_UID)
        self.relay_uid = relay_uid
        self.refused = 0
        """Connections hung up on (not the relay uid, or bad ancillary data)."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock.bind(socket_address(self.name))
        self._sock.listen(BACKLOG)
        self._sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self) -> list[Handover]:
        """Every pending connection (at most :data:`MAX_ACCEPTS`) as a handover, or hung up on."""
        taken: list[Handover] = []
        for _ in range(MAX_ACCEPTS):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            handover = self._receive(conn)
            if handover is None:
                self.refused += 1
                with contextlib.suppress(OSError):
                    conn.close()
            else:
                taken.append(handover)
        return taken

    def _receive(self, conn: socket.socket) -> Handover | None:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != self.relay_uid:
            return None  # kernel code (or anyone but the exec'd handover): not a byte is read
        conn.settimeout(1.0)  # the handover sends at once after connecting
        fds = array.array("i")
        try:
            _, ancillary, flags, _ = conn.recvmsg(1, socket.CMSG_SPACE(2 * fds.itemsize))
        except OSError:
            return None
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if len(fds) != 2 or flags & socket.MSG_CTRUNC:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return None
        for fd in fds:
            os.set_inheritable(fd, False)
            os.set_blocking(fd, False)
        conn.setblocking(False)
        return Handover(conn, fds[0], fds[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


@dataclass(frozen=True, slots=True)
class Accepted:
    """The candidate proved it knows the secret."""

    host_nonce: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """Why the candidate is hung up on (said to it in a ``refused`` frame)."""

    reason: str


class Candidate:
    """A host on a handover's pipes, challenged with a fresh nonce (see the module docstring)."""

    def __init__(self, handover: Handover, secret: str, agent_hash: str | None, now: float) -> None:
        self.handover = handover
        self.nonce = secrets.token_hex(frames.NONCE_BYTES)
        self.deadline = now + CANDIDATE_TIMEOUT
        self._secret = secret
        self._decoder = frames.FrameDecoder(max_frame_bytes=MAX_CANDIDATE_BYTES)
        self._read = 0
        self.write({"type": frames.CHALLENGE, "nonce": self.nonce, "agent_hash": agent_hash})

    @property
    def input_fd(self) -> int:
        return self.handover.input_fd

    def write(self, frame: frames.Frame) -> None:
        """A small handshake frame, written at once (a fresh pipe holds 64 KiB); a candidate that
        does not take it is not worth waiting for."""
        with contextlib.suppress(OSError):
            os.write(self.handover.output_fd, frames.encode(frame))

    def on_readable(self) -> Accepted | Rejected | None:
        """Read what it sent; a verdict once there is one (None: not yet)."""
        try:
            chunk = os.read(self.handover.input_fd, MAX_CANDIDATE_BYTES)
        except BlockingIOError:
            return None
        except OSError as exc:
            return Rejected(f"its pipe failed ({exc.strerror or exc})")
        if not chunk:
            return Rejected("it left before its hello")
        self._read += len(chunk)
        for item in self._decoder.feed(chunk):
            if isinstance(item, frames.FrameError):
                return Rejected(f"it sent garbage ({item.reason})")
            return self._check(item)
        if self._read > MAX_CANDIDATE_BYTES:
            return Rejected(f"more than {MAX_CANDIDATE_BYTES:,} bytes without a hello")
        return None

    def _check(self, frame: frames.Frame) -> Accepted | Rejected:
        if frame["type"] != frames.HELLO:
            return Rejected(f"its first frame was {frames.clip(frame['type'], 40)!r}, not a hello")
        host_nonce = frame.get("nonce")
        if not isinstance(host_nonce, str) or not 16 <= len(host_nonce) <= 128:
            return Rejected("its hello carries no nonce")
        expected = frames.adoption_proof(self._secret, frames.HOST_ROLE, self.nonce, host_nonce, frame)
        if not frames.proof_matches(expected, frame.get("proof")):
            return Rejected("its proof does not match this sandbox's secret and its hello")
        return Accepted(host_nonce)

    @property
    def heard_from(self) -> bool:
        """It has sent something since its challenge (a silent one may be a dead bridge's)."""
        return self._read > 0

    def expired(self, now: float) -> bool:
        return now > self.deadline

    def refuse(self, reason: str) -> None:
        """Say why, and hang up (the handover process exits; so does its exec session)."""
        self.write({"type": frames.REFUSED, "reason": reason})
        self.handover.close()


def adopted_frame(
    secret: str, candidate: Candidate, accepted: Accepted, facts: dict[str, object]
) -> frames.Frame:
    """The agent's answer to a host that proved itself: ``facts``, and its proof, a MAC over them
    and both nonces (a relay on the way can neither replay it nor change a fact)."""
    adopted: frames.Frame = {"type": frames.ADOPTED, **facts, "at": time.time()}
    adopted["proof"] = frames.adoption_proof(
        secret, frames.AGENT_ROLE, candidate.nonce, accepted.host_nonce, adopted
    )
    return adopted
