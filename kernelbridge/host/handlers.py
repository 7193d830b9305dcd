"""What the owner of a bridge sandbox hears from it: handlers passed where its loop starts.

``await tg.start(partial(sandbox.run, handlers))``: a sandbox has its handlers from its first
event to its end and never has them replaced (the mcp SDK's ``Dispatcher.run(on_request,
on_notify)`` takes its handlers the same way). A handler left out means nobody listens: iopub and
replies are dropped, and rpc requests are answered ``unavailable`` (no host MCP servers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kernelbridge.tunnel import RpcRequest

KernelListener = Callable[[dict[str, Any]], Awaitable[None]]
ReplyListener = Callable[[dict[str, Any]], None]
RpcHandler = Callable[[RpcRequest], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SandboxHandlers:
    on_iopub: KernelListener | None = None
    """Every iopub message of the kernel, whoever's cell it is (awaited: backpressure)."""
    on_reply: ReplyListener | None = None
    """Every reply to the bridge's own requests (e.g. the execute_reply of its cells)."""
    on_rpc: RpcHandler | None = None
    """Every rpc request of the sandbox's code; must return at once and answer later with
    :meth:`~kernelbridge.host.sandbox.Sandbox.answer_rpc`."""
    on_end: Callable[[], None] | None = None
    """Called once when the sandbox has ended (dead or closed)."""


NO_HANDLERS = SandboxHandlers()
