"""The host end of the tunnel: frames on a sandbox's stdio stream <-> Jupyter clients and its owner.

- :mod:`~kernelbridge.tunnel.core`: :class:`Tunnel`, the relay and router;
- :mod:`~kernelbridge.tunnel.sockets`: the five kernel sockets for Jupyter clients, bounded in bytes;
- :mod:`~kernelbridge.tunnel.channel`: the control channel to the tunnel's owner (memory or socket).

A tunnel runs inside the bridge's process for the bridge's own sessions, or as a small process of
its own (``kernelbridge.kernel.tunnel_process``) for a sandbox a plain Jupyter client started.
"""

from kernelbridge.tunnel.channel import FrameChannel, SocketFrameChannel, memory_channel_pair
from kernelbridge.tunnel.core import ClientExecute, PeerMessage, Tunnel, TunnelState
from kernelbridge.tunnel.sockets import ClientSockets

__all__ = [
    "ClientExecute",
    "ClientSockets",
    "FrameChannel",
    "PeerMessage",
    "SocketFrameChannel",
    "Tunnel",
    "TunnelState",
    "memory_channel_pair",
]
