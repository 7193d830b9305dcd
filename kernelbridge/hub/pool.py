"""The client pool: one :class:`~kernelbridge.hub.clients.ServerClient` per configured host server,
and the task group their connections' runners live in (the lifecycle of one connection is
:mod:`kernelbridge.hub.clients`' docstring). Closing is shielded and bounded by :data:`CLOSE_TIMEOUT`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc

from kernelbridge.hub.clients import ServerClient
from kernelbridge.hub.config import ServerConfig

log = logging.getLogger("kernelbridge.hub.clients")

CLOSE_TIMEOUT = 10.0
"""Bound on closing every client: the SDK's stdio shutdown takes at most ~6.5 s per server
(stdin close, 2 s grace, SIGTERM, 2 s, SIGKILL, 2 s), and servers close in parallel."""


class ClientPool:
    """One :class:`ServerClient` per configured server, and the task group their runners live in.

    ``async with ClientPool(...) as pool``; ``pool.get(name)`` returns the server's client.
    """

    def __init__(
        self,
        servers: Mapping[str, ServerConfig],
        aliases: Mapping[str, str],
        *,
        env: Mapping[str, str],
        log_dir: Path | None,
        call_timeout: float,
        connect_mode: str = "auto",
    ) -> None:
        self.env = dict(env)
        self.log_dir = log_dir
        self.call_timeout = call_timeout
        self.connect_mode = connect_mode
        self._servers = dict(servers)
        self._aliases = dict(aliases)
        self._clients: dict[str, ServerClient] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        if self._tg is None:
            raise RuntimeError("the client pool is not open: use `async with ClientPool(...)`")
        return self._tg

    def get(self, name: str) -> ServerClient:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = ServerClient(self, self._servers[name], self._aliases[name])
        return client

    def clients(self) -> list[ServerClient]:
        return list(self._clients.values())

    async def __aenter__(self) -> ClientPool:
        if self.log_dir is not None:
            try:
                self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                log.warning("host server logs disabled: cannot create their directory (%s)", exc.strerror)
                self.log_dir = None
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tg = self.task_group
        with anyio.CancelScope(shield=True):
            for client in self._clients.values():
                client.close()
            with anyio.move_on_after(CLOSE_TIMEOUT) as bound:
                for client in self._clients.values():
                    await client.wait_closed()
            if bound.cancelled_caught:
                log.warning("host servers did not close within %g s; cancelling them", CLOSE_TIMEOUT)
            tg.cancel_scope.cancel()
        self._tg = None
        return await tg.__aexit__(exc_type, exc, tb)
