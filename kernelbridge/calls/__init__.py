"""The sandbox -> host call seam: one rpc request as the session layer hands it on, and who answers.

A sandbox's ``rpc_request`` reaches its session's broker, which makes an :class:`RpcCall` (the
untrusted method and params, and what the bridge knows: session, grants, namespace, sandbox, who
may approve) and awaits an :class:`RpcHandler`: the hub, the package service
(``packages.service.WithPackages`` routes between them), or a replay's recording. The wire's
validation is :mod:`.wire`, approval's records :mod:`.approval`. Nothing here does I/O or knows MCP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kernelbridge.calls.approval import Approver
from kernelbridge.errors import NO_SERVERS_CONFIGURED, NoHostServers

__all__ = ["NO_HUB", "NoHub", "RpcCall", "RpcHandler"]


@dataclass(frozen=True, slots=True)
class RpcCall:
    """One ``rpc_request`` from a sandbox, as the session layer hands it to the hub."""

    session: str
    """The calling session's name."""
    grants: frozenset[str]
    """Canonical server names granted to that session (from ``Hub.validate_grants``)."""
    method: object
    """Untrusted: whatever the sandbox sent."""
    params: object
    """Untrusted JSON value."""
    namespace: str = ""
    """The HTTP token's namespace the session belongs to (``""``: the shared one, stdio). Set by
    the bridge, never by the sandbox: everything the hub keeps per tenant (saved tools, calls in
    flight) is keyed by it, so two tokens' sessions called ``default`` never meet."""
    sandbox: str = ""
    """The container the call came from (set by the bridge): what is kept per sandbox (the
    package service's caps, whose /packages went with the container) starts afresh with a new one."""
    approve: Approver | None = None
    """Asks a person about a call that needs approval (``KERNELBRIDGE_APPROVE_TOOLS``): supplied by
    the session layer for the cell that made the call; None: nobody can be asked, refused."""


class RpcHandler(Protocol):
    """What the session layer calls for each rpc request."""

    async def dispatch(self, call: RpcCall) -> object:
        """The JSON-able result. Raises RpcError only; cancelling the caller cancels the call."""
        ...


class NoHub(RpcHandler):
    """Who answers where no hub serves: every call is refused ``unavailable`` with ``message``."""

    def __init__(self, message: str = NoHostServers.IN_THIS_KERNEL) -> None:
        self.message = message

    async def dispatch(self, call: RpcCall) -> object:
        raise NoHostServers(self.message)


NO_HUB = NoHub(f"{NO_SERVERS_CONFIGURED} for this bridge")
"""A registry's answer when it was given no hub."""
