"""The kernelbridge exception hierarchy. Library errors are translated into these at the layer
boundaries (e.g. a failing ``podman`` call becomes RuntimeUnavailable inside ``runtime/``)::

    KernelBridgeError                 base of everything kernelbridge raises on purpose
    ├── ConfigError                   a bad setting or config file (one line says which and why)
    ├── RuntimeUnavailable            no usable container runtime (podman/docker missing or broken)
    │   └── EngineRefused             the engine API answered a call with an error status
    ├── ImageError                    sandbox image missing, stale, or its build failed
    ├── SandboxError                  a sandbox failed to start or misbehaved
    │   ├── AgentMismatch             the image's agent is not the one this host expects
    │   ├── KernelDied                the kernel process in the sandbox exited
    │   ├── SandboxStartFailed        the sandbox ended (or never came) before its kernel was ready
    │   │   └── PortsInUse            the ports a Jupyter client chose were taken before they were bound
    │   ├── SandboxStartTimeout       its kernel was not ready within the start timeout
    │   ├── LimitsNotEnforced         the runtime ignores memory/pid limits and that is not allowed
    │   ├── AdoptionFailed            a sandbox that outlived its bridge could not be taken over
    │   └── SandboxFileError          a file request on /workspace was refused (``kind``)
    ├── SessionError                  session-level refusal (bad name, too many sessions, ...)
    ├── HubError                      host MCP servers: an unknown or denied server name, a skill refused
    │   ├── SkillError                a saved tool (skill) name, size or lookup was refused
    │   └── ServerFailure             a host server could not answer (start failure, crash, protocol)
    └── RpcError                      the answer to one sandbox rpc request: ``kind`` + ``message``
        │                             (kinds in docs/rpc.md); its message goes to sandboxed code
        └── NoHostServers             ``unavailable``: no host MCP server can answer this sandbox

    RuntimeError
    └── IllegalTransition             a bug: a state change a state machine forbids (never caught)

How a sandbox ended is an :class:`ExitKind` (the host's enum of the ``exit`` frame's wire strings in
:mod:`kernelbridge.frames`). A start failure crosses a process boundary (the tunnel process tells its
provisioner) as a kind and a reason, so exceptions and exit kinds are mapped here, once each way:
:func:`start_error` (kind -> exception) and :func:`exit_of` (exception -> kind), inverse of each other.

Every message says what happened, why it matters and what to do.
"""

from __future__ import annotations

import enum

from kernelbridge import frames, transitions


class KernelBridgeError(Exception):
    """Base class of kernelbridge's own errors."""


class ConfigError(KernelBridgeError, ValueError):
    """A setting or config file is invalid."""


class RuntimeUnavailable(KernelBridgeError):
    """No container runtime can run sandboxes here."""


class EngineRefused(RuntimeUnavailable):
    """A container engine's API answered a call with an error status (its message in one line).

    Raised and caught inside ``kernelbridge.runtime`` (which turns a missing container or image
    into None or ImageError); what escapes it is an engine refusing something it should not.
    """

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status (404, 409, 500...)."""
        self.reason = reason
        """The engine's own message (``No such container: x``), for the branches in ``runtime/``."""


class ImageError(KernelBridgeError):
    """The sandbox image is missing, stale or could not be built."""


class SandboxError(KernelBridgeError):
    """A sandbox failed to start or stopped unexpectedly."""


class AgentMismatch(SandboxError):
    """The agent inside the image does not match this kernelbridge."""


class KernelDied(SandboxError):
    """The kernel inside the sandbox exited."""


class SandboxStartFailed(SandboxError):
    """The sandbox ended, or could not be started, before its kernel was ready.

    ``reason`` is why, as the agent, the runtime or the tunnel said it; the message adds what failed.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the sandbox failed to start: {reason}")
        self.reason = reason


class PortsInUse(SandboxStartFailed):
    """The Jupyter ports a client chose were taken by another process before the tunnel bound
    them (a client picks free ports, closes them and hands them over: a race on a busy host). The
    kernelspec's provisioner picks new ones and starts again."""


class SandboxStartTimeout(SandboxError):
    """The sandbox's kernel did not prove it was ready within the start timeout."""


class LimitsNotEnforced(SandboxError):
    """The runtime ignores memory and pid limits and the operator did not allow that."""


class AdoptionFailed(SandboxError):
    """A sandbox that outlived its bridge could not be adopted: it is gone, it refused (another
    bridge is attached), or it is not the sandbox this session made (a wrong secret, garbage).
    ``reason`` is one line; the session goes on in a fresh sandbox and says so."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the session's sandbox could not be adopted: {reason}")
        self.reason = reason


class SandboxFileError(SandboxError):
    """A file operation on /workspace was refused (``kind``: not_found, invalid_path, too_large...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class SessionError(KernelBridgeError):
    """A session operation was refused."""


class HubError(KernelBridgeError):
    """A request about host MCP servers was refused (unknown or denied server, ...)."""


class SkillError(HubError):
    """A saved tool (skill) could not be stored, found or removed."""


class ServerFailure(HubError):
    """A host server could not answer (start failure, crash, transport error, protocol error).

    The message is one line fit for sandboxed code: it names the server, never its command,
    environment, URL or headers.
    """


class RpcError(KernelBridgeError):
    """The error answer to one rpc request from sandboxed code (see docs/rpc.md).

    ``kind`` is one of the documented error kinds; ``message`` is one line that sandboxed code
    reads, so it never contains host paths, commands, environment values or headers.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def to_wire(self) -> dict[str, str]:
        """The ``error`` member of an ``rpc_response`` frame."""
        return {"kind": self.kind, "message": self.message}

    def __repr__(self) -> str:
        return f"RpcError({self.kind!r}, {self.message!r})"


NO_HOST_SERVERS = "no host MCP servers"
"""How the host says that no host MCP server can answer, wherever it says it (the hub, the
sessions, a sandbox without a hub); the in-container ``mcp`` package, which cannot import this
module, says it in the same words."""
NO_SERVERS_CONFIGURED = f"{NO_HOST_SERVERS} are configured"
ADD_SERVERS = (
    "configure them in an MCP client (Claude Code, Claude Desktop, Cursor, VS Code), in ~/MCPs/*.json"
    " or with --servers-config; `kernelbridge servers` shows what is found"
)


class NoHostServers(RpcError):
    """The ``unavailable`` answer of a sandbox that no hub serves."""

    IN_THIS_KERNEL = f"{NO_HOST_SERVERS} in this kernel"
    """A sandbox whose owner has no hub (the bridge's own checks, such as ``kernelbridge doctor``)."""
    PLAIN_JUPYTER = (
        f"{IN_THIS_KERNEL}: it was started by a plain Jupyter client, not by a kernelbridge bridge"
    )
    """A sandbox started by ``jupyter console``, nbclient or jupyter_server: there is no bridge."""

    def __init__(self, message: str = IN_THIS_KERNEL) -> None:
        super().__init__("unavailable", message)


IllegalTransition = transitions.IllegalTransition
"""A state machine was asked for a change its table forbids (:mod:`kernelbridge.transitions`)."""


# -- exit kinds ---------------------------------------------------------------------------------


class ExitKind(enum.Enum):
    """Why a sandbox ended or never came: the ``kind`` of an ``exit`` frame (wire strings in
    :mod:`kernelbridge.frames`, which the in-container agent shares)."""

    AGENT_MISMATCH = frames.EXIT_AGENT_MISMATCH
    """The image carries another agent than the one this host expects."""
    IMAGE_MISSING = frames.EXIT_IMAGE_MISSING
    START_FAILED = frames.EXIT_START_FAILED
    """The runtime, the agent or the host could not start the sandbox."""
    START_TIMEOUT = frames.EXIT_START_TIMEOUT
    KERNEL_DIED = frames.EXIT_KERNEL_DIED
    """The kernel exited; the reason says how (a signal, out of memory)."""
    OOM = frames.EXIT_OOM
    """The container's memory limit killed it."""
    CONTAINER_EXITED = frames.EXIT_CONTAINER_EXITED
    """The container ended without an exit frame (the agent had no last word)."""
    SHUTDOWN = frames.EXIT_SHUTDOWN
    """Asked for."""
    PROTOCOL = frames.EXIT_PROTOCOL
    """The sandbox broke the frame protocol."""
    PORTS_IN_USE = frames.EXIT_PORTS_IN_USE
    """The tunnel could not bind the ports it was given (:class:`PortsInUse`)."""

    @classmethod
    def from_wire(cls, value: object) -> ExitKind:
        """The kind a sandbox sent; anything unknown is a kernel that died."""
        try:
            return cls(value)
        except ValueError:
            return cls.KERNEL_DIED


def start_error(
    kind: ExitKind | None, reason: str = "", *, detail: str = "", oom: bool = False
) -> SandboxError | ImageError:
    """The error for a sandbox that ended before it was ready (kind -> exception).

    ``kind``/``reason``: its exit (None: none came); ``detail``: the runtime's last stderr line;
    ``oom``: the engine saw the memory limit kill it. The inverse is :func:`exit_of`.
    """
    if kind is ExitKind.CONTAINER_EXITED:
        reason = ""  # the tunnel's placeholder: the container said nothing, its stderr may
    if kind is ExitKind.AGENT_MISMATCH:
        return AgentMismatch(reason)
    if kind is ExitKind.IMAGE_MISSING:
        return ImageError(reason)
    if oom or kind is ExitKind.OOM:
        return KernelDied(f"the kernel ran out of memory while starting ({reason or 'killed'})")
    if kind is ExitKind.KERNEL_DIED:
        return KernelDied(reason or "the kernel exited while starting")
    if kind is ExitKind.START_TIMEOUT:
        return SandboxStartTimeout(reason)
    if kind is ExitKind.PORTS_IN_USE:
        return PortsInUse(reason or "the kernel ports are in use")
    return SandboxStartFailed(reason or detail or "the container exited before its kernel was ready")


def exit_of(exc: BaseException) -> tuple[ExitKind, str]:
    """The exit kind and reason that tell another process about ``exc`` (exception -> kind), so
    that :func:`start_error` there raises the same error with the same message."""
    if isinstance(exc, AgentMismatch):
        return ExitKind.AGENT_MISMATCH, str(exc)
    if isinstance(exc, ImageError):
        return ExitKind.IMAGE_MISSING, str(exc)
    if isinstance(exc, KernelDied):
        return ExitKind.KERNEL_DIED, str(exc)
    if isinstance(exc, SandboxStartTimeout):
        return ExitKind.START_TIMEOUT, str(exc)
    if isinstance(exc, PortsInUse):
        return ExitKind.PORTS_IN_USE, exc.reason
    if isinstance(exc, SandboxStartFailed):
        return ExitKind.START_FAILED, exc.reason
    return ExitKind.START_FAILED, str(exc)
