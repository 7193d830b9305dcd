"""The bridge's own Jupyter client of one sandbox: the tunnel's in-process peer.

It builds messages, sends requests straight to the tunnel (no ZMQ), pairs replies with whoever
waits for them, and hands every iopub message and reply to the sandbox's handlers. Nobody may
answer ``input()``: requests go with ``allow_stdin`` off and stdin messages are dropped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from kernelbridge.host.handlers import SandboxHandlers
from kernelbridge.inside.kernel import HOST_CELL

PROTOCOL_VERSION = "5.3"

SendKernel = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Send a kernel message to the sandbox; raises SandboxError if it is not running or wedged."""


@dataclass
class _Waiter:
    done: anyio.Event
    reply: dict[str, Any] | None = None


class BridgeClient:
    """Requests of the bridge to one sandbox's kernel and their replies."""

    def __init__(self, send: SendKernel) -> None:
        self._send = send
        self.session_id = uuid.uuid4().hex
        self._waiters: dict[str, _Waiter] = {}

    async def deliver(
        self, handlers: SandboxHandlers, channel: str, msg: dict[str, Any], buffers: list[bytes]
    ) -> None:
        """The tunnel's peer callback (``partial(client.deliver, handlers)``): iopub to the
        handlers; a reply to its waiter, then to the handlers."""
        if channel == "iopub":
            if handlers.on_iopub is not None:
                await handlers.on_iopub(msg)
            return
        if channel == "stdin":
            return  # the bridge never allows stdin; an input_request would have no one to answer
        parent = msg.get("parent_header")
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        waiter = self._waiters.get(msg_id) if isinstance(msg_id, str) else None
        if waiter is not None:
            waiter.reply = msg
            waiter.done.set()
        if handlers.on_reply is not None:
            handlers.on_reply(msg)

    def new_message(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        header = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "kernelbridge",
            "session": self.session_id,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            "version": PROTOCOL_VERSION,
        }
        return {"header": header, "parent_header": {}, "metadata": {}, "content": content}

    async def request(
        self,
        channel: str,
        msg_type: str,
        content: dict[str, Any],
        *,
        msg_id: str | None = None,
        wait: bool = True,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Send a request; with ``wait`` its reply can be awaited with :meth:`reply`. Returns the
        msg_id. Raises SandboxError if the sandbox is not running or does not take the request
        in time."""
        msg = self.new_message(msg_type, content)
        if metadata:
            msg["metadata"] = metadata
        if msg_id is not None:
            msg["header"]["msg_id"] = msg_id
        msg_id = msg["header"]["msg_id"]
        if wait:
            self._waiters[msg_id] = _Waiter(anyio.Event())
        try:
            await self._send(channel, msg)
        except BaseException:
            self._waiters.pop(msg_id, None)
            raise
        return msg_id

    async def execute(
        self,
        code: str,
        *,
        msg_id: str | None = None,
        silent: bool = False,
        store_history: bool = True,
        stop_on_error: bool = False,
        wait: bool = True,
    ) -> str:
        """Send an execute_request (``allow_stdin`` is off: nobody can answer ``input()``).
        ``wait=False``: the reply goes to the handlers' ``on_reply`` only."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history and not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": stop_on_error,
        }
        metadata = {HOST_CELL: True}  # the host waits for idle too: no pause before the reply
        return await self.request(
            "shell", "execute_request", content, msg_id=msg_id, wait=wait, metadata=metadata
        )

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any] | None:
        """The reply to ``msg_id`` within ``timeout`` seconds, or None (timeout, or the sandbox ended)."""
        waiter = self._waiters.get(msg_id)
        if waiter is None:
            return None
        with anyio.move_on_after(timeout):
            await waiter.done.wait()
        if waiter.done.is_set():
            self._waiters.pop(msg_id, None)
        return waiter.reply

    def forget(self, msg_id: str) -> None:
        """Stop waiting for a reply that will not be read."""
        self._waiters.pop(msg_id, None)

    def end(self) -> None:
        """The sandbox ended: wake every waiter (no reply will come)."""
        for waiter in self._waiters.values():
            waiter.done.set()
