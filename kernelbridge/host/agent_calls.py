"""The calls between the bridge and a sandbox's agent that are not Jupyter messages.

- **rpc**: sandboxed code's calls to the host (``RpcRequest``) go to the handlers' ``on_rpc``
  (the session's broker), which answers later with :meth:`AgentCalls.answer_rpc`; with no handler
  they are answered ``unavailable`` at once (:class:`~kernelbridge.errors.NoHostServers`);
- **files**: file operations on the sandbox's /workspace, served by the agent (``FsRequest`` /
  ``FsResponse``), awaited by :meth:`AgentCalls.files`.

Both travel as commands through the owner's queue, which never waits for the sandbox.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from kernelbridge.errors import NoHostServers, SandboxError, SandboxFileError
from kernelbridge.host.handlers import SandboxHandlers
from kernelbridge.tunnel import Command, FsRequest, FsResponse, RpcRequest, RpcResponse

FILE_TIMEOUT = 60.0
"""Default bound on one file operation (a 24 MiB file over a busy stdin)."""


@dataclass
class _FileWaiter:
    done: anyio.Event
    answer: FsResponse | None = None


class Agent(Protocol):
    """What the calls need of the sandbox's owner."""

    name: str

    @property
    def alive(self) -> bool: ...

    def send(self, command: Command) -> None: ...


class AgentCalls:
    """One sandbox's rpc answers and file requests."""

    def __init__(self, agent: Agent) -> None:
        self.name = agent.name
        self._agent = agent
        self._file_waiters: dict[int, _FileWaiter] = {}
        self._file_ids = itertools.count(1)

    async def on_event(self, handlers: SandboxHandlers, event: RpcRequest | FsResponse) -> None:
        """The owner's event handler (``partial(calls.on_event, handlers)``)."""
        if isinstance(event, FsResponse):
            # Untrusted (relayed from the sandbox): an unhashable id must not end the event pump.
            waiter = self._file_waiters.get(event.id) if isinstance(event.id, int) else None
            if waiter is not None:
                waiter.answer = event
                waiter.done.set()
        elif handlers.on_rpc is not None:
            await handlers.on_rpc(event)
        else:
            await self.answer_rpc(event.id, error=NoHostServers().to_wire())

    async def answer_rpc(
        self, request_id: object, *, result: Any = None, error: dict[str, str] | None = None
    ) -> None:
        """Answer an rpc request (queued; never waits for the sandbox)."""
        self._agent.send(RpcResponse(request_id, result, error))

    async def files(
        self, op: str, *, path: str = ".", data: str | None = None, timeout: float = FILE_TIMEOUT
    ) -> Any:
        """Run a file operation in the sandbox's /workspace (see ``inside/agent/files.py``).
        Raises SandboxFileError (refused), SandboxError (not running, or no answer in time)."""
        if not self._agent.alive:
            raise SandboxError(f"the sandbox of {self.name!r} is not running")
        request_id = next(self._file_ids)
        waiter = self._file_waiters[request_id] = _FileWaiter(anyio.Event())
        try:
            with anyio.move_on_after(timeout):
                self._agent.send(FsRequest(request_id, op, path, data))
                await waiter.done.wait()
        finally:
            self._file_waiters.pop(request_id, None)
        answer = waiter.answer
        if answer is None:
            raise SandboxError(f"the sandbox did not answer a file request within {timeout:g} s")
        if answer.error is not None:
            raise SandboxFileError(answer.error["kind"], answer.error["message"])
        return answer.result

    def end(self) -> None:
        """The sandbox ended: wake every file request (no answer will come)."""
        for waiter in self._file_waiters.values():
            waiter.done.set()
