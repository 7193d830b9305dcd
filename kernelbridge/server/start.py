"""A bridge answers ``initialize`` at once, and starts meanwhile (issue 24).

What a bridge opens at start (the engine, maybe with a podman service of its own; the image
check; the host MCP servers; the registries, with the sandboxes a bridge before left) took
seconds, and importing what it needs one more: MCP clients show a server as starting until it
answers ``initialize``, and some give up. So the lifespan runs that opening as a task,
:class:`BridgeStart`, its modules imported in a worker thread first so that the event loop keeps
answering; :func:`start_gate`, a server middleware, lets what needs none of it through at once
(``initialize``, ``ping``, the lists, notifications) and has every other request wait for it and
see what it opened as its lifespan context. A bridge with sessions to adopt waits for the start
(and their adoption, bounded) before it answers: a restarted client's first call then finds its
session attached, as before.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

from kernelbridge.config import Settings
from kernelbridge.session.records import Standing
from kernelbridge.session.store import sessions_of
from kernelbridge.taskgroups import exit_task_group

T = TypeVar("T")

START_MODULES = (
    "kernelbridge.host.policy",
    "kernelbridge.hub.dispatch",
    "kernelbridge.packages.service",
    "kernelbridge.runtime.engine.connect",
    "kernelbridge.runtime.select",
    "kernelbridge.session.durability",
    "kernelbridge.session.registry",
)
"""What a bridge's opening imports (``server.app``'s ``open_bridge``), imported in a worker
thread first: a second of CPU that the event loop, answering meanwhile, does not wait for."""

WITHOUT_THE_START = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    }
)
"""Requests answered from what the server was built with: none waits for the start. Their
handlers see the :class:`BridgeStart` as the lifespan context, and do not look at it."""


def starting(
    opening: Callable[[], AbstractAsyncContextManager[T]], settings: Settings
) -> Callable[[object], AbstractAsyncContextManager[T]]:
    """A server lifespan that serves while ``opening`` runs as a :class:`BridgeStart`; with
    sessions a bridge before left, they are adopted (within ``ADOPTION_WAIT``) before it serves.
    Typed as what requests see: :func:`start_gate` hands them what the start opened."""

    @asynccontextmanager
    async def lifespan(_: object) -> AsyncIterator[Any]:
        async with BridgeStart(opening, START_MODULES) as start:
            if await anyio.to_thread.run_sync(sessions_to_adopt, settings):
                await start.opened()
            yield start

    return lifespan


class BridgeStart(Generic[T]):
    """``opening()`` entered as a task from ``async with``, and left at its end (or cancelled if
    it is still opening then); its failure ends the server, as a lifespan's does."""

    def __init__(self, opening: Callable[[], AbstractAsyncContextManager[T]], modules: Sequence[str]) -> None:
        self._opening = opening
        self._modules = modules
        self._opened: T | None = None
        self._ready = anyio.Event()
        self._stop = anyio.Event()
        self._scope = anyio.CancelScope()
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> BridgeStart[T]:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        if self._ready.is_set():
            self._stop.set()  # what it opened closes as the lifespan did: bounded, shielded
        else:
            self._scope.cancel()  # the client left before the bridge was up: nothing to keep
        return await exit_task_group(self._tg, exc_type, exc, tb)

    async def opened(self) -> T:
        """What the start opened, once it has."""
        await self._ready.wait()
        assert self._opened is not None
        return self._opened

    async def _run(self) -> None:
        with self._scope:
            # Imports are CPU, which would hold the event loop for a second: in a thread instead.
            await anyio.to_thread.run_sync(_import, self._modules)
            async with self._opening() as opened:
                self._opened = opened
                self._ready.set()
                await self._stop.wait()


def _import(modules: Sequence[str]) -> None:
    for name in modules:
        importlib.import_module(name)


async def start_gate(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Server middleware: a request that needs the bridge waits for its start, then sees what the
    start opened as its lifespan context (the tools' ``ctx.request_context.lifespan_context``)."""
    start = ctx.lifespan_context
    light = ctx.method in WITHOUT_THE_START or ctx.method.startswith("notifications/")
    if light or not isinstance(start, BridgeStart):
        return await call_next(ctx)
    return await call_next(dataclasses.replace(ctx, lifespan_context=await start.opened()))


def sessions_to_adopt(settings: Settings) -> bool:
    """Whether the state directory has sessions a bridge before left (detached, not held by a
    live bridge), which this one adopts before it answers. Blocking: a few small files read."""
    if not settings.durable:
        return False
    return any(standing is Standing.DETACHED for _, standing in sessions_of(settings.state_dir))
