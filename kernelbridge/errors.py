"""The kernelbridge exception hierarchy. Library errors are translated into these at the layer
boundaries (e.g. a failing ``podman`` call becomes RuntimeUnavailable inside ``runtime/``)::

    KernelBridgeError                 base of everything kernelbridge raises on purpose
    ├── ConfigError                   a bad setting or config file (one line says which and why)
    ├── RuntimeUnavailable            no usable container runtime (podman/docker missing or broken)
    │   └── EngineRefused             the engine API answered a call with an error status
    ├── ImageError                    sandbox image missing, stale, or its build failed
    ├── SandboxError                  a sandbox failed to start or misbehaved
    │   ├── AgentMismatch             the image's agent is not the one this host expects
    │   └── KernelDied                the kernel process in the sandbox exited
    ├── SessionError                  session-level refusal (bad name, too many sessions, ...)
    ├── HubError                      host MCP servers: an unknown or denied server name, a skill refused
    │   └── SkillError                a saved tool (skill) name, size or lookup was refused
    └── RpcError                      the answer to one sandbox rpc request: ``kind`` + ``message``
                                      (kinds in docs/rpc.md); its message goes to sandboxed code

Every message says what happened, why it matters and what to do.
"""

from __future__ import annotations


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


class SessionError(KernelBridgeError):
    """A session operation was refused."""


class HubError(KernelBridgeError):
    """A request about host MCP servers was refused (unknown or denied server, ...)."""


class SkillError(HubError):
    """A saved tool (skill) could not be stored, found or removed."""


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
