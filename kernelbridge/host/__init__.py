"""The bridge's side of one sandbox: its container, its tunnel's owner, its client, its policy.

- :mod:`~kernelbridge.host.sandbox`: :class:`Sandbox`, one sandboxed kernel of the bridge, made of:
- :mod:`~kernelbridge.host.owner`: :class:`TunnelOwner`, the one owner of a tunnel (container +
  Tunnel + control channel; ready/exit, restart-then-wait, graceful stop), also used by the tunnel
  process of :mod:`kernelbridge.jupyter`;
- :mod:`~kernelbridge.host.state`: :class:`SandboxState` and its one transition function;
- :mod:`~kernelbridge.host.client`: the bridge's own Jupyter client (requests, replies, execute);
- :mod:`~kernelbridge.host.agent_calls`: rpc answers and file requests to the agent;
- :mod:`~kernelbridge.host.commands`: the owner's non-blocking queue of commands;
- :mod:`~kernelbridge.host.handlers`: what a sandbox's owner hears, passed to ``Sandbox.run``;
- :mod:`~kernelbridge.host.container`: a container's spec from the settings, and how a sandbox
  obtains its container and stream (created, or adopted);
- :mod:`~kernelbridge.host.policy`: what a bridge may start (:class:`SandboxGate`, preflight);
- :mod:`~kernelbridge.host.connection`: connection files;
- :mod:`~kernelbridge.host.warm_pool`: sandboxes started ahead of need.

It knows nothing of sessions, cells or MCP; everything here runs on the host.
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
