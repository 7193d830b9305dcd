"""The control channel's messages between a tunnel and its owner, typed: decoded once, where a frame
becomes a message (which message goes which way: docs/architecture.md, "Control channel").

In one process they travel as objects (:func:`~kernelbridge.tunnel.channel.memory_channel_pair`),
between processes as frames of :mod:`kernelbridge.frames` (:meth:`to_frame` / :func:`from_frame`).
What the sandbox sends (``ready``, ``exit``, ``rpc_request``, ``fs_response``) is untrusted: the
decoders here clip its strings and keep only well-typed fields, so no owner parses a sandbox's dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from kernelbridge import frames
from kernelbridge.errors import ExitKind
from kernelbridge.tunnel.durable import Adoption

MAX_REASON = 500
"""Characters of an exit reason kept: one line for a model or a log."""


@dataclass(frozen=True, slots=True)
class Ready:
    """The kernel proved iopub delivers."""

    TYPE: ClassVar[str] = frames.READY
    versions: dict[str, str] = field(default_factory=dict)
    """python, ipykernel, agent (clipped; at most 20 entries)."""
    agent_hash: str = ""
    adoption: Adoption | None = None
    """Set when the sandbox was adopted (it already ran): what it said of the time without a
    bridge. In the bridge only (a tunnel process never adopts): not part of the frame."""

    def to_frame(self) -> frames.Frame:
        return {"type": self.TYPE, "versions": dict(self.versions), "agent_hash": self.agent_hash}

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> Ready:
        versions = frame.get("versions")
        clipped = (
            {frames.clip(k, 40): frames.clip(v, 80) for k, v in list(versions.items())[:20]}
            if isinstance(versions, dict)
            else {}
        )
        return cls(clipped, frames.clip(frame.get("agent_hash") or "", 80))


@dataclass(frozen=True, slots=True)
class Exited:
    """The sandbox is gone, or never came: how (``kind``) and why (``reason``, one line)."""

    TYPE: ClassVar[str] = frames.EXIT
    status: int | None
    """The kernel's exit status (negative: a signal); None when unknown."""
    kind: ExitKind
    reason: str

    def to_frame(self) -> frames.Frame:
        return {"type": self.TYPE, "status": self.status, "kind": self.kind.value, "reason": self.reason}

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> Exited:
        status = frame.get("status")
        return cls(
            status if isinstance(status, int) and not isinstance(status, bool) else None,
            ExitKind.from_wire(frame.get("kind")),
            frames.clip(frame.get("reason") or "the kernel exited", MAX_REASON),
        )


@dataclass(frozen=True, slots=True)
class RpcRequest:
    """A call from sandboxed code to the host (docs/rpc.md). The fields are as the sandbox sent
    them; admitting one (an integer id, the budget) is the answering side's business."""

    TYPE: ClassVar[str] = frames.RPC_REQUEST
    id: object
    method: str
    params: Any = None
    cell: str | None = None
    """The msg_id of the cell whose code made the call."""

    def to_frame(self) -> frames.Frame:
        return {
            "type": self.TYPE,
            "id": self.id,
            "method": self.method,
            "params": self.params,
            "cell": self.cell,
        }

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> RpcRequest:
        cell = frame.get("cell")
        return cls(
            frame.get("id"),
            frames.clip(frame.get("method"), 200),
            frame.get("params"),
            cell if isinstance(cell, str) else None,
        )


@dataclass(frozen=True, slots=True)
class _Answer:
    """The answer to a request: ``result``, or ``error`` {kind, message}."""

    TYPE: ClassVar[str] = ""
    id: object
    result: Any = None
    error: dict[str, str] | None = None

    def to_frame(self) -> frames.Frame:
        if self.error is not None:
            return {"type": self.TYPE, "id": self.id, "error": self.error}
        return {"type": self.TYPE, "id": self.id, "result": self.result}


@dataclass(frozen=True, slots=True)
class FsResponse(_Answer):
    """The agent's answer to an :class:`FsRequest` (its error kinds: not_found, invalid_path,
    too_large...)."""

    TYPE: ClassVar[str] = frames.FS_RESPONSE

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> FsResponse:
        error = frame.get("error")
        if isinstance(error, dict):
            refused = {
                "kind": frames.clip(error.get("kind"), 40),
                "message": frames.clip(error.get("message"), 500),
            }
            return cls(frame.get("id"), None, refused)
        return cls(frame.get("id"), frame.get("result"))


@dataclass(frozen=True, slots=True)
class _Bare:
    """A command that is only its type."""

    TYPE: ClassVar[str] = ""

    def to_frame(self) -> frames.Frame:
        return {"type": self.TYPE}

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> Self:
        return cls()


@dataclass(frozen=True, slots=True)
class Interrupt(_Bare):
    """SIGINT to the kernel's process group."""

    TYPE: ClassVar[str] = frames.INTERRUPT


@dataclass(frozen=True, slots=True)
class Restart(_Bare):
    """A new kernel in the same container (answered by Ready)."""

    TYPE: ClassVar[str] = frames.RESTART


@dataclass(frozen=True, slots=True)
class Shutdown(_Bare):
    """Stop the kernel and leave."""

    TYPE: ClassVar[str] = frames.SHUTDOWN


@dataclass(frozen=True, slots=True)
class Detach(_Bare):
    """Leave the sandbox running (a durable one): no shutdown; a later bridge may adopt it."""

    TYPE: ClassVar[str] = frames.DETACH


@dataclass(frozen=True, slots=True)
class Resume(_Bare):
    """An adopted sandbox may now send what it held back (the bridge is ready to hear it)."""

    TYPE: ClassVar[str] = frames.RESUME


@dataclass(frozen=True, slots=True)
class RpcResponse(_Answer):
    """The host's answer to an :class:`RpcRequest` (error kinds in docs/rpc.md)."""

    TYPE: ClassVar[str] = frames.RPC_RESPONSE

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> RpcResponse:
        error = frame.get("error")
        return cls(frame.get("id"), frame.get("result"), error if isinstance(error, dict) else None)


@dataclass(frozen=True, slots=True)
class FsRequest:
    """A file operation on /workspace (``op``: list, read, write; ``data``: base64, write only)."""

    TYPE: ClassVar[str] = frames.FS_REQUEST
    id: int
    op: str
    path: str = "."
    data: str | None = None

    def to_frame(self) -> frames.Frame:
        frame: frames.Frame = {"type": self.TYPE, "id": self.id, "op": self.op, "path": self.path}
        if self.data is not None:
            frame["data"] = self.data
        return frame

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> FsRequest:
        request_id, data = frame.get("id"), frame.get("data")
        return cls(
            request_id if isinstance(request_id, int) else 0,
            str(frame.get("op")),
            str(frame.get("path", ".")),
            data if isinstance(data, str) else None,
        )


@dataclass(frozen=True, slots=True)
class Launch:
    """What a tunnel process must start, sent first by its provisioner (built and read by
    :mod:`kernelbridge.jupyter.launch`; the tunnel layer only carries it)."""

    TYPE: ClassVar[str] = frames.LAUNCH
    connection_file: str
    agent_hash: str | None
    container: dict[str, Any]
    """A ContainerSpec's fields but ``limits`` (labels as ``[key, value]`` pairs)."""
    limits: dict[str, Any]
    runtime: str | None
    engine: dict[str, Any]
    state_dir: str
    start_timeout: float
    allow_unlimited: bool
    packages: dict[str, Any] = field(default_factory=dict)
    """``%pip install`` settings (``config.PackageSettings`` as a dict) for the tunnel's own
    package service: a kernelspec kernel installs through the host as a bridge's session does."""

    def to_frame(self) -> frames.Frame:
        return {
            "type": self.TYPE,
            "connection_file": self.connection_file,
            "agent_hash": self.agent_hash,
            "container": self.container,
            "limits": self.limits,
            "runtime": self.runtime,
            "engine": self.engine,
            "state_dir": self.state_dir,
            "start_timeout": self.start_timeout,
            "allow_unlimited": self.allow_unlimited,
            "packages": self.packages,
        }

    @classmethod
    def from_frame(cls, frame: frames.Frame) -> Launch:
        """Raises ValueError if a required field is missing or of the wrong type."""
        connection_file, container, state_dir = (
            frame.get("connection_file"), frame.get("container"), frame.get("state_dir")
        )  # fmt: skip
        if not (
            isinstance(connection_file, str) and isinstance(container, dict) and isinstance(state_dir, str)
        ):
            raise ValueError("a launch frame needs connection_file, container and state_dir")
        agent_hash, runtime = frame.get("agent_hash"), frame.get("runtime")
        return cls(
            connection_file,
            agent_hash if isinstance(agent_hash, str) else None,
            container,
            dict(frame.get("limits") or {}),
            runtime if isinstance(runtime, str) else None,
            dict(frame.get("engine") or {}),
            state_dir,
            float(frame.get("start_timeout") or 60.0),
            bool(frame.get("allow_unlimited")),
            dict(frame.get("packages") or {}),
        )


Event = Ready | Exited | RpcRequest | FsResponse
"""What a tunnel tells its owner."""
Command = Interrupt | Restart | Shutdown | RpcResponse | FsRequest | Detach | Resume
"""What an owner tells its tunnel (and the tunnel relays to the sandbox's agent)."""
ControlMessage = Event | Command | Launch

_DECODERS: dict[str, Callable[[frames.Frame], ControlMessage]] = {
    cls.TYPE: cls.from_frame
    for cls in (
        Ready,
        Exited,
        RpcRequest,
        FsResponse,
        Interrupt,
        Restart,
        Shutdown,
        RpcResponse,
        FsRequest,
        Launch,
    )
}


def from_frame(frame: frames.Frame) -> ControlMessage | None:
    """The control message a frame carries, or None when it is not one (a ``kernel``, ``hello``
    or ``log`` frame, or a launch frame without its fields)."""
    decode = _DECODERS.get(str(frame.get("type")))
    if decode is None:
        return None
    try:
        return decode(frame)
    except (TypeError, ValueError):
        return None
