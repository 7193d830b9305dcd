"""The kernelbridge exception hierarchy. Library errors are translated into these at the layer
boundaries (e.g. a failing ``podman`` call becomes RuntimeUnavailable inside ``runtime/``)::

    KernelBridgeError                 base of everything kernelbridge raises on purpose
    ├── ConfigError                   a bad setting or config file (one line says which and why)
    ├── RuntimeUnavailable            no usable container runtime (podman/docker missing or broken)
    ├── ImageError                    sandbox image missing, stale, or its build failed
    ├── SandboxError                  a sandbox failed to start or misbehaved
    │   ├── AgentMismatch             the image's agent is not the one this host expects
    │   └── KernelDied                the kernel process in the sandbox exited
    └── SessionError                  session-level refusal (bad name, too many sessions, ...)

Every message says what happened, why it matters and what to do.
"""

from __future__ import annotations


class KernelBridgeError(Exception):
    """Base class of kernelbridge's own errors."""


class ConfigError(KernelBridgeError, ValueError):
    """A setting or config file is invalid."""


class RuntimeUnavailable(KernelBridgeError):
    """No container runtime can run sandboxes here."""


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
