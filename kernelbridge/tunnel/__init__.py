"""The host end of the tunnel: frames on a sandbox's stdio stream <-> Jupyter clients and its owner.

A tunnel is run by its owner, :class:`kernelbridge.host.owner.TunnelOwner` (in the bridge's process,
or in a tunnel process for a plain Jupyter client's sandbox), and talks to it only over its control
channel (:mod:`~kernelbridge.tunnel.channel`). It knows nothing of runtimes, sessions, Jupyter
clients' kernels or MCP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.tunnel.channel import ControlChannel, SocketControlChannel, memory_channel_pair
    from kernelbridge.tunnel.core import ClientExecute, PeerMessage, Tunnel, TunnelState
    from kernelbridge.tunnel.durable import Adoption, Durability, InheritedCell
    from kernelbridge.tunnel.events import (
        Command,
        ControlMessage,
        Detach,
        Event,
        Exited,
        FsRequest,
        FsResponse,
        Interrupt,
        Launch,
        Ready,
        Restart,
        Resume,
        RpcRequest,
        RpcResponse,
        Shutdown,
    )
    from kernelbridge.tunnel.sockets import ClientSockets

__all__ = [
    "Adoption",
    "ClientExecute",
    "ClientSockets",
    "Command",
    "ControlChannel",
    "ControlMessage",
    "Detach",
    "Durability",
    "Event",
    "Exited",
    "FsRequest",
    "FsResponse",
    "InheritedCell",
    "Interrupt",
    "Launch",
    "PeerMessage",
    "Ready",
    "Restart",
    "Resume",
    "RpcRequest",
    "RpcResponse",
    "Shutdown",
    "SocketControlChannel",
    "Tunnel",
    "TunnelState",
    "memory_channel_pair",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
