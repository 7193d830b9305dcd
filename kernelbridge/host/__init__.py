"""The bridge's side of one sandbox: its container, its tunnel's owner, its client, its policy.

Everything here runs on the host and knows nothing of sessions, cells or MCP. Its
:class:`TunnelOwner` also runs the sandbox of a plain Jupyter client's tunnel process
(:mod:`kernelbridge.jupyter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.host.container import AttachedContainer, ContainerSource, NewContainer, container_spec
    from kernelbridge.host.handlers import NO_HANDLERS, SandboxHandlers
    from kernelbridge.host.owner import TunnelOwner
    from kernelbridge.host.policy import SandboxGate, SandboxPolicy, expected_image, preflight, verify_image
    from kernelbridge.host.sandbox import Sandbox
    from kernelbridge.host.state import Death, SandboxState
    from kernelbridge.host.warm_pool import WarmPool, close_sandbox

__all__ = [
    "NO_HANDLERS",
    "AttachedContainer",
    "ContainerSource",
    "Death",
    "NewContainer",
    "Sandbox",
    "SandboxGate",
    "SandboxHandlers",
    "SandboxPolicy",
    "SandboxState",
    "TunnelOwner",
    "WarmPool",
    "close_sandbox",
    "container_spec",
    "expected_image",
    "preflight",
    "verify_image",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
