"""A sandbox as the session layer holds it: its seat (the handlers it was started with) and a call's
view of it for the cell runner.

Every sandbox the registry starts sits in a :class:`Seat` from its first event on (the warm pool
pools seats): its iopub and replies go to the recorder, its rpc requests to the rpc broker, of the
session the seat was given to; until then, to nobody (rpc requests are answered ``unavailable``).
The handlers are passed where the sandbox's loop starts (``tg.start(partial(sandbox.run,
seat.handlers()))``); a session taking the seat fills in its recorder and broker, never the
handlers themselves.

:class:`SeatTarget` is what one call's :class:`~kernelbridge.session.runner.CellRunner` sees of the
session's sandbox: the verbs of :class:`~kernelbridge.session.runner.CellTarget`, with the
registry's answers to "the session was closed", "discard it", "its kernel was restarted" passed in.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelbridge import frames
from kernelbridge.errors import NO_SERVERS_CONFIGURED, NoHostServers, SandboxError
from kernelbridge.host import Death, Sandbox, SandboxHandlers
from kernelbridge.hub.rpc import RpcCall, RpcHandler
from kernelbridge.session.broker import RpcBroker
from kernelbridge.session.cell import Cell
from kernelbridge.session.recorder import Recorder
from kernelbridge.session.runner import CellTarget
from kernelbridge.tunnel import RpcRequest

log = logging.getLogger(__name__)

REFRESH_CODE = "__import__('mcp')._kernelbridge_refresh()"
"""Sent as a silent request: rebinds ``mcp_<alias>`` proxies for the session's grants."""


@dataclass(eq=False, slots=True)
class Seat:
    """A sandbox the registry started, with the handlers it was started with (see the module
    docstring)."""

    sandbox: Sandbox
    recorder: Recorder | None = None
    broker: RpcBroker | None = None
    on_end: Callable[[Seat], None] | None = None
    """The session's: the sandbox ended (it may have died while idle)."""

    def handlers(self) -> SandboxHandlers:
        return SandboxHandlers(self._on_iopub, self._on_reply, self._on_rpc, self._on_end)

    async def refresh_proxies(self, session: str, timeout: float) -> bool | None:
        """Rebind the kernel's host-MCP proxies to the session's grants (a silent request, whose
        manifest call the broker admits), waiting at most ``timeout``. True: done; False: the
        kernel refused or did not answer (say so); None: the sandbox failed, which the call's
        own cell will meet and say."""
        assert self.recorder is not None and self.broker is not None
        msg_id = uuid.uuid4().hex
        self.recorder.ignore(msg_id)
        self.broker.open_cell(msg_id)
        try:
            await self.sandbox.kernel.execute(REFRESH_CODE, msg_id=msg_id, silent=True)
            reply = await self.sandbox.kernel.reply(msg_id, timeout)
        except SandboxError as exc:
            log.warning("session %s: refreshing the mcp proxies failed: %s", session, exc)
            return None
        finally:
            self.broker.close_cell(msg_id)
        content = (reply or {}).get("content") or {}
        if content.get("status") == "ok":
            return True
        why = f"{content.get('ename')}: {content.get('evalue')}" if content else "no answer"
        log.warning("session %s: refreshing the mcp proxies failed: %s", session, frames.clip(why, 300))
        return False

    async def _on_iopub(self, msg: dict[str, Any]) -> None:
        if self.recorder is not None:
            await self.recorder.on_iopub(msg)

    def _on_reply(self, msg: dict[str, Any]) -> None:
        if self.recorder is not None:
            self.recorder.on_reply(msg)

    async def _on_rpc(self, request: RpcRequest) -> None:
        if self.broker is not None:
            await self.broker.on_request(request)
        else:
            await self.sandbox.agent.answer_rpc(request.id, error=NoHostServers().to_wire())

    def _on_end(self) -> None:
        if self.recorder is not None:
            self.recorder.wake_all()
        if self.on_end is not None:
            self.on_end(self)


class SeatTarget(CellTarget):
    """One call's view of its session's seat (see the module docstring)."""

    def __init__(
        self,
        seat: Seat,
        *,
        closed: Callable[[], bool],
        discard: Callable[[], None],
        restarted: Callable[[], None],
    ) -> None:
        self._seat = seat
        self._closed = closed
        self._discard = discard
        self._restarted = restarted

    @property
    def alive(self) -> bool:
        return self._seat.sandbox.alive

    @property
    def death(self) -> Death | None:
        return self._seat.sandbox.death

    @property
    def closed(self) -> bool:
        return self._closed()

    def busy_elsewhere(self, cell: Cell) -> bool:
        return self._seat.recorder is not None and self._seat.recorder.busy_elsewhere(cell)

    async def send(self, code: str, msg_id: str) -> None:
        await self._seat.sandbox.kernel.execute(code, msg_id=msg_id, wait=False)

    async def interrupt(self) -> None:
        await self._seat.sandbox.interrupt()

    async def restart(self, timeout: float) -> bool:
        return await self._seat.sandbox.restart(timeout)

    def cancel_calls(self, cell: str | None) -> None:
        if self._seat.broker is not None:
            self._seat.broker.cancel(cell)

    def restarted(self) -> None:
        self._restarted()

    def discard(self) -> None:
        self._discard()


class _NoHub(RpcHandler):
    """The rpc handler of a registry given none: every call is refused ``unavailable``."""

    async def dispatch(self, call: RpcCall) -> object:
        raise NoHostServers(f"{NO_SERVERS_CONFIGURED} for this bridge")


NO_HUB = _NoHub()
