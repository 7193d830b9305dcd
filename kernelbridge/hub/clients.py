"""One warm MCP client per host server, shared by every session of a hub.

``async with ClientPool(servers, aliases, ...) as pool``, then ``pool.get(name).call_tool(...)``.
A server's connection (a child process for stdio, an HTTP session) starts on first use and stays
warm for every session's calls; its life is docs/architecture.md's "A host server's connection".
This layer knows MCP and transports, nothing of sessions, grants, policy or the rpc wire. Secrets
(a stdio server's ``env``, an HTTP server's headers) appear in no message it raises; a stdio
server's stderr goes to a bounded log file (``<logs>/hub/<alias>.log``), never to the bridge's
stdout, which is the MCP wire.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import anyio
import anyio.abc
import anyio.lowlevel
import httpx2
import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from kernelbridge import __version__
from kernelbridge.errors import ServerFailure
from kernelbridge.frames import MAX_RPC_BYTES
from kernelbridge.hub.client_state import Change, next_state
from kernelbridge.hub.client_state import ClientState as ClientState  # kernelbridge.hub re-exports it
from kernelbridge.hub.config import HttpServer, ServerConfig, StdioServer
from kernelbridge.hub.streams import StderrLog, watch_transport
from kernelbridge.taskgroups import exit_task_group

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
"""Seconds for a server to start and list its tools. ``npx``/``uvx`` servers may install
themselves on first start; a dead command fails in milliseconds anyway."""
START_RETRY_AFTER = 5.0
"""After a failed start, calls within this many seconds get the same error instead of spawning
the broken command again (a search over every server would otherwise spawn it each time)."""
MAX_TOOL_PAGES = 100
MAX_TOOLS = 2000
"""A server listing more tools than this is misbehaving; the rest are ignored."""
MAX_SSE_EVENT_BYTES = 2 * MAX_RPC_BYTES
"""One server-sent event (one answer) over HTTP. The SDK's default (1 MiB) would break 10 MB results;
twice the rpc cap lets a result just over the cap be answered ``too_large`` rather than fail the
transport, while still bounding what a remote server can make the hub buffer."""

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


class _Connection:
    """One server process (or HTTP session) from start to exit; its :class:`ClientState`
    changes only through :meth:`change`."""

    def __init__(self, *, restart: bool) -> None:
        self.state = ClientState.IDLE
        self.restart = restart
        """Started because the previous connection had run and exited."""
        self.answered = 0
        """Tool calls answered; a restart that fails before answering any 'failed again'."""
        self.ready = anyio.Event()
        """Set once the start has settled (READY, FAILED, or closed while starting)."""
        self.stop = anyio.Event()
        self.done = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self.client: Client | None = None
        self.tools: list[types.Tool] | None = None
        self.tools_lock = anyio.Lock()
        self.changes = 0
        self.fetches = 0
        self.start_error: str | None = None
        """Why the start failed (one safe line)."""
        self.failed_at = 0.0
        self.failure: str | None = None
        """Why a running connection ended, when known (one safe line)."""

    def change(self, change: Change) -> ClientState:
        """The one place the state changes. Raises IllegalTransition (a bug) for a forbidden pair."""
        self.state = next_state(self.state, change)
        return self.state

    def fail(self, reason: str) -> None:
        """The start failed: calls within START_RETRY_AFTER get ``reason``."""
        self.start_error = reason
        self.failed_at = anyio.current_time()
        self.change(Change.FAIL)

    def mark_exited(self) -> None:
        self.change(Change.EXIT)
        self.stop.set()

    def tools_changed(self) -> None:
        self.tools = None
        self.changes += 1


class ServerClient:
    """The hub's one client to one host server. Create through :meth:`ClientPool.get`."""

    def __init__(self, pool: ClientPool, config: ServerConfig, alias: str) -> None:
        self._pool = pool
        self.config = config
        self.name = config.name
        self.alias = alias
        self._conn = _Connection(restart=False)
        self._generation = 0
        self._stderr = StderrLog(pool.log_dir / f"{alias}.log" if pool.log_dir else None)

    def __repr__(self) -> str:
        return f"<ServerClient {self.name!r} {self.state.value} starts={self.starts}>"

    @property
    def state(self) -> ClientState:
        """The current connection's state."""
        return self._conn.state

    @property
    def starts(self) -> int:
        """How many times a connection was started (1 + restarts)."""
        return self._generation

    def stderr_tail(self) -> list[str]:
        """The last lines the server wrote to stderr (for logs and doctor; may hold secrets)."""
        return list(self._stderr.tail)

    # -- what dispatch uses ------------------------------------------------------------------

    async def tools(self, *, refresh: bool = False) -> list[types.Tool]:
        """The server's tools, cached; ``refresh`` fetches them again. Raises ServerFailure."""
        conn = await self._ready()
        return await self._tools_of(conn, refresh=refresh)

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call one tool. A result with ``is_error`` is returned, not raised.

        Raises ServerFailure if the server cannot be started, exits, times out or answers with
        a protocol error (its message is passed on).
        """
        conn = await self._ready()
        assert conn.client is not None
        timeout = self._pool.call_timeout
        try:
            with anyio.fail_after(timeout):
                result = await conn.client.call_tool(tool, arguments)
            conn.answered += 1
            return result
        except TimeoutError:
            raise ServerFailure(f"server {self.name!r} did not answer within {timeout:g} s") from None
        except MCPError as exc:
            raise self._protocol_error(conn, exc) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            conn.mark_exited()
            raise self._died(conn) from None
        except (ValidationError, RuntimeError) as exc:
            raise ServerFailure(f"server {self.name!r} sent an invalid result: {_describe(exc)}") from None

    def close(self) -> None:
        """Ask the connection to close (the runner does it); no new one will start."""
        conn = self._conn
        starting = conn.state is ClientState.STARTING
        running = conn.state is not ClientState.IDLE
        conn.change(Change.CLOSE)
        conn.stop.set()
        if starting:
            conn.start_error = "closed while starting"
            if conn.scope is not None:
                conn.scope.cancel()
        if not running:
            conn.done.set()  # no runner: nothing to wait for

    async def wait_closed(self) -> None:
        await self._conn.done.wait()

    # -- connection management -----------------------------------------------------------------

    def _connection(self) -> _Connection:
        """The live connection, or a new one being started. Synchronous: racing callers get the
        same connection."""
        conn = self._conn
        if conn.state is ClientState.CLOSED:
            raise ServerFailure(f"server {self.name!r} is not available: kernelbridge is shutting down")
        if conn.state in (ClientState.STARTING, ClientState.READY):
            return conn
        if conn.state is ClientState.FAILED and anyio.current_time() - conn.failed_at < START_RETRY_AFTER:
            return conn
        if conn.state is not ClientState.IDLE:  # exited, or failed a while ago: a fresh one
            conn = self._conn = _Connection(restart=conn.state is ClientState.EXITED)
        self._pool.task_group.start_soon(self._run, conn, name=f"hub client {self.name}")
        conn.change(Change.START)
        self._generation += 1
        return conn

    async def _ready(self) -> _Connection:
        """A started connection. One that exits between starting and this caller waking up is
        replaced once (the caller never sent it anything)."""
        for _ in range(2):
            conn = self._connection()
            await conn.ready.wait()
            if conn.state is ClientState.READY:
                break
            if conn.start_error is not None:  # FAILED, or CLOSED while starting
                reason = f"could not start: {conn.start_error}"
                if conn.restart:
                    reason = f"exited, was restarted and failed again: {reason}"
                raise ServerFailure(f"server {self.name!r} {reason}")
        return conn

    def _protocol_error(self, conn: _Connection, exc: MCPError) -> ServerFailure:
        """An MCP error answer (its message passed on), or the connection's end seen as one."""
        if exc.code == CONNECTION_CLOSED or conn.state is not ClientState.READY:
            return self._died(conn)
        return ServerFailure(f"server {self.name!r}: {_safe(exc.message)}")

    def _died(self, conn: _Connection) -> ServerFailure:
        detail = conn.failure or "the connection closed"
        if conn.restart and not conn.answered:
            return ServerFailure(f"server {self.name!r} was restarted and failed again ({detail})")
        return ServerFailure(
            f"server {self.name!r} exited during the call ({detail}); it is restarted on the next call"
        )

    async def _tools_of(self, conn: _Connection, *, refresh: bool) -> list[types.Tool]:
        if conn.tools is not None and not refresh:
            return conn.tools
        fetches = conn.fetches
        async with conn.tools_lock:
            if conn.tools is not None and (not refresh or conn.fetches != fetches):
                return conn.tools  # fetched by another caller while this one waited
            assert conn.client is not None
            changes = conn.changes
            try:
                with anyio.fail_after(START_TIMEOUT):
                    tools = await _list_tools(conn.client)
            except TimeoutError:
                raise ServerFailure(
                    f"server {self.name!r} did not list its tools within {START_TIMEOUT:g} s"
                ) from None
            except MCPError as exc:
                raise self._protocol_error(conn, exc) from None
            except (
                ValidationError,
                RuntimeError,
                anyio.ClosedResourceError,
                anyio.BrokenResourceError,
            ) as exc:
                raise ServerFailure(
                    f"server {self.name!r} could not list its tools: {_describe(exc)}"
                ) from None
            conn.fetches += 1
            if conn.changes == changes:
                conn.tools = tools
            return tools

    async def _run(self, conn: _Connection) -> None:
        """Own one connection from start to close (a task in the pool's task group)."""
        try:
            with anyio.CancelScope() as scope:
                conn.scope = scope
                if conn.state is ClientState.CLOSED:  # closed before this task ran
                    scope.cancel()
                scope.deadline = anyio.current_time() + START_TIMEOUT
                async with self._open_client(conn) as client:
                    tools = await _list_tools(client)
                    scope.deadline = math.inf
                    conn.client, conn.tools = client, tools
                    conn.change(Change.STARTED)
                    conn.ready.set()
                    log.info("host server %r started (%d tools)", self.name, len(tools))
                    async with anyio.create_task_group() as tg:
                        if _can_listen(client):
                            tg.start_soon(self._listen, conn, client)
                        await conn.stop.wait()
                        tg.cancel_scope.cancel()
            if scope.cancelled_caught and conn.state is ClientState.STARTING:
                conn.fail(f"did not start within {START_TIMEOUT:g} s")
        except Exception as exc:
            reason = _describe(exc)
            if conn.state is ClientState.STARTING:
                conn.fail(reason)
                log.warning("host server %r could not start: %s", self.name, reason)
            else:
                conn.failure = reason
                log.warning("host server %r failed: %s", self.name, reason)
            log.debug("host server %r: details", self.name, exc_info=exc)
        finally:
            if conn.state is ClientState.STARTING:  # cancelled from outside
                conn.fail("closed while starting")
            conn.change(Change.EXIT)
            conn.ready.set()
            conn.done.set()
            if conn.start_error is None:
                log.info("host server %r closed", self.name)

    @asynccontextmanager
    async def _open_client(self, conn: _Connection) -> AsyncIterator[Client]:
        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                conn.tools_changed()
            elif isinstance(message, Exception):
                log.debug("host server %r: transport message %r", self.name, message)
            await anyio.lowlevel.checkpoint()

        async with AsyncExitStack() as stack:
            errlog: TextIO | None = None
            if isinstance(self.config, StdioServer):
                errlog = self._stderr_pipe()
                transport: Any = stdio_client(self._stdio_parameters(self.config), errlog=errlog)
            else:
                transport = streamable_http_client(
                    self.config.url,
                    http_client=await stack.enter_async_context(self._http_client(self.config)),
                    max_sse_event_size=MAX_SSE_EVENT_BYTES,
                )
            client = Client(
                watch_transport(transport, conn.mark_exited),
                mode=self._pool.connect_mode,
                cache=None,
                message_handler=on_message,
                client_info=types.Implementation(name="kernelbridge", version=__version__),
            )
            try:
                await stack.enter_async_context(client)
            finally:
                if errlog is not None:
                    errlog.close()  # the child has its own copy; EOF then means the child is gone
            yield client

    async def _listen(self, conn: _Connection, client: Client) -> None:
        """Keep a ``subscriptions/listen`` stream open (2026-07-28) so tools/list_changed arrives.

        The events also reach ``on_message`` (the SDK tees them), which drops the tool cache.
        """
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    conn.tools_changed()
        except Exception as exc:  # the server refused or the connection ended: nothing to do
            log.debug("host server %r: tools listen stream ended: %s", self.name, _describe(exc))

    def _stdio_parameters(self, config: StdioServer) -> StdioServerParameters:
        # As MCP clients do: the host's environment, plus the entry's own variables.
        env = {**self._pool.env, **config.env}
        return StdioServerParameters(command=config.command, args=list(config.args), env=env, cwd=config.cwd)

    def _http_client(self, config: HttpServer) -> httpx2.AsyncClient:
        # No read timeout of its own: a long tool call is bounded by the pool's call timeout.
        timeout = httpx2.Timeout(30.0, read=self._pool.call_timeout)
        return httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout)

    def _stderr_pipe(self) -> TextIO:
        """A pipe for the child's stderr, drained into the bounded log by a pool task."""
        read_fd, write_fd = os.pipe()
        self._pool.task_group.start_soon(self._stderr.drain, read_fd, name=f"hub stderr {self.name}")
        return os.fdopen(write_fd, "w")


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None or len(tools) >= MAX_TOOLS:
            break
    return tools[:MAX_TOOLS]


def _can_listen(client: Client) -> bool:
    tools = client.server_capabilities.tools
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS and bool(tools and tools.list_changed)


def _describe(exc: BaseException) -> str:
    """One safe line for an exception: the innermost cause, without URLs or file paths."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError) and exc.strerror:
        return (
            f"could not launch the command ({exc.strerror})"
            if isinstance(exc, FileNotFoundError | PermissionError)
            else exc.strerror
        )
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return "the server closed the connection (see its log)"
    text = _safe(str(exc)) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, httpx2.HTTPError) else text


def _safe(message: str) -> str:
    """A server-supplied message fit for one line: URLs removed, whitespace folded, bounded."""
    return " ".join(_URL.sub("<url>", message).split())[:500]


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
        return await exit_task_group(tg, exc_type, exc, tb)
