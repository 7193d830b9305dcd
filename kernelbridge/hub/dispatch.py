"""The Hub: host MCP servers for every session of a bridge, answering sandbox rpc requests.

One Hub serves every namespace of a bridge; what it keeps per tenant is keyed by namespace (the
skills stores) or ``(RpcCall.namespace, RpcCall.session)`` (calls in flight), never by a bare
session name. The configuration is read once, when it is created (bad files: :meth:`Hub.problems`).
:meth:`Hub.dispatch` validates every request first and raises nothing but RpcError (a bug: kind
``internal``, a generic message, its traceback logged); cancelling its task cancels the MCP request
in flight. Use: :mod:`kernelbridge.hub`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import mcp_types as types

from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.calls.approval import ApprovalRequest, Decision, refusal
from kernelbridge.calls.wire import check_result_size, parse_request
from kernelbridge.config import Settings, namespace_state_dir
from kernelbridge.errors import (
    ADD_SERVERS,
    NO_SERVERS_CONFIGURED,
    HubError,
    RpcError,
    ServerFailure,
    SkillError,
)
from kernelbridge.frames import MAX_RPC_IN_FLIGHT
from kernelbridge.hub import docs, skills
from kernelbridge.hub.aliases import assign_aliases, resolve
from kernelbridge.hub.clients import START_TIMEOUT, ClientPool, ServerClient
from kernelbridge.hub.config import ServerCatalog, load_catalog
from kernelbridge.hub.docs import ToolEntry
from kernelbridge.hub.policy import Policy

log = logging.getLogger("kernelbridge.hub")

DOCS_TIMEOUT = 20.0
"""How long search and detailed discovery wait for servers to start. A server still starting
is left out of that answer (and keeps starting for the next one): docs must stay quick."""
CALL_TIMEOUT_MARGIN = 30.0
"""A tool call is bounded by the longest cell timeout plus this: no call outlives every cell."""

_Handler = Callable[[RpcCall, dict[str, Any]], Awaitable[object]]


class Hub(RpcHandler):
    """Host MCP servers, policy and rpc dispatch for one bridge. Not thread-safe; one event loop.

    ``env`` (default ``os.environ``) supplies ``HOME`` for config discovery and the base
    environment of stdio servers. ``connect_mode`` is the MCP client's protocol negotiation
    (``"auto"``; ``"legacy"`` forces the 2025 initialize handshake).
    """

    def __init__(
        self, settings: Settings, *, env: Mapping[str, str] | None = None, connect_mode: str = "auto"
    ) -> None:
        self.settings = settings
        env = os.environ if env is None else env
        self._catalog: ServerCatalog = load_catalog(settings, env)
        for problem in self._catalog.problems:
            log.warning("host MCP servers: %s", problem)
        self._policy = Policy.from_settings(settings)
        self._aliases = assign_aliases(self._catalog.servers)
        self._pool = ClientPool(
            self._catalog.servers,
            self._aliases,
            env=env,
            log_dir=settings.logs_dir / "hub",
            call_timeout=settings.max_timeout + CALL_TIMEOUT_MARGIN,
            connect_mode=connect_mode,
        )
        self._in_flight: dict[tuple[str, str], int] = {}
        """Calls in flight per (namespace, session)."""
        self._handlers: dict[str, _Handler] = {
            "manifest": self._manifest,
            "list_servers": self._list_servers,
            "discovered_servers": self._discovered_servers,
            "describe_server": self._describe_server,
            "list_tools": self._list_tools,
            "query_tool_docs": self._query_tool_docs,
            "search_tool_docs": self._search_tool_docs,
            "call_tool": self._call_tool,
            "save_tool": self._save_tool,
            "list_skills": self._list_skills,
            "load_skill": self._load_skill,
        }

    def __repr__(self) -> str:
        return f"<Hub servers={self.server_names()} clients={self._pool.clients()}>"

    async def __aenter__(self) -> Hub:
        await self._pool.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        """Close every client (shielded, bounded); stdio servers' processes end with it."""
        return await self._pool.__aexit__(exc_type, exc, tb)

    # -- for the session layer, the server and doctor ----------------------------------------------

    def server_names(self) -> list[str]:
        """Configured servers the operator allows, in configuration order."""
        return [name for name in self._catalog.servers if self._policy.server_allowed(name)]

    def summaries(self) -> list[dict[str, Any]]:
        """ServerSummary records of the allowed servers (name, alias, description, transport;
        never a command, environment, URL or header), for the manual. Starts nothing."""
        return [
            docs.server_summary(name, self._aliases[name], self._catalog.servers[name], granted=False)
            for name in self.server_names()
        ]

    def problems(self) -> list[str]:
        """One line per config file or entry that was skipped (paths shown with ``~``)."""
        return list(self._catalog.problems)

    def resolve(self, name: str) -> str | None:
        """The real name of the allowed server called ``name`` (or by that alias), or None."""
        real = resolve(name, self._aliases)
        return real if real is not None and self._policy.server_allowed(real) else None

    def client(self, name: str) -> ServerClient:
        """The pool's client of a configured server (state, restarts, stderr tail)."""
        return self._pool.get(name)

    def validate_grants(self, names: list[str]) -> list[str]:
        """The canonical names for a session's ``servers=[...]`` (real names or aliases).

        Raises HubError naming an unknown or operator-denied server and listing the allowed ones.
        """
        canonical: list[str] = []
        for name in names:
            if not isinstance(name, str):
                raise HubError(f"server names are strings, got {type(name).__name__}")
            real = resolve(name, self._aliases)
            if real is None:
                raise HubError(f"unknown server {name[:100]!r}; {self._known()}")
            if not self._policy.server_allowed(real):
                why = self._policy.why_denied(real)
                raise HubError(f"server {name!r} is denied by the operator ({why}); {self._known()}")
            if real not in canonical:
                canonical.append(real)
        return canonical

    def _known(self) -> str:
        names = self.server_names()
        if names:
            return "configured servers: " + ", ".join(names)
        return f"{NO_SERVERS_CONFIGURED} ({ADD_SERVERS})"

    # -- dispatch ----------------------------------------------------------------------------------

    async def dispatch(self, call: RpcCall) -> object:
        """Answer one rpc request (see docs/rpc.md). Raises RpcError only."""
        try:
            method, params = parse_request(call.method, call.params)
            key = (call.namespace, call.session)
            if self._in_flight.get(key, 0) >= MAX_RPC_IN_FLIGHT:
                raise RpcError("busy", f"{MAX_RPC_IN_FLIGHT} calls are already in flight in this session")
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            try:
                result = await self._handlers[method](call, params)
            finally:
                left = self._in_flight[key] - 1
                if left:
                    self._in_flight[key] = left
                else:
                    del self._in_flight[key]
            check_result_size(result)
            return result
        except RpcError:
            raise
        except Exception:
            who = _qualified(call.namespace, call.session)
            log.exception("hub: %s from session %r failed", str(call.method)[:60], who)
            raise RpcError("internal", "internal error in kernelbridge (logged on the host)") from None

    # -- servers and tools -------------------------------------------------------------------------

    def _server(self, name: str, call: RpcCall | None = None) -> str:
        """The real name of an allowed server (granted to ``call``'s session if given)."""
        real = resolve(name, self._aliases)
        if (
            real is None
            or not self._policy.server_allowed(real)
            or (call is not None and real not in call.grants)
        ):
            raise RpcError("not_available", f"Server '{name}' is not available")
        return real

    def _granted(self, call: RpcCall) -> list[str]:
        return [name for name in self.server_names() if name in call.grants]

    async def _entries(self, server: str, *, refresh: bool = False) -> list[ToolEntry]:
        """The server's tools the policy allows, with aliases. Raises ServerFailure."""
        tools = await self._pool.get(server).tools(refresh=refresh)
        aliases = assign_aliases(tool.name for tool in tools)
        return [
            ToolEntry(server, self._aliases[server], tool, aliases[tool.name])
            for tool in tools
            if self._policy.tool_allowed(server, tool.name)
        ]

    async def _tool(self, server: str, name: str) -> ToolEntry:
        """One allowed tool by real name or alias; a cache miss refreshes the list once."""
        if not self._policy.tool_allowed(server, name):
            raise RpcError("denied", f"Tool '{name}' of server '{server}' is denied by the operator")
        for refresh in (False, True):
            tools = await self._pool.get(server).tools(refresh=refresh)
            aliases = assign_aliases(tool.name for tool in tools)
            real = resolve(name, aliases)
            if real is not None:
                if not self._policy.tool_allowed(server, real):
                    raise RpcError("denied", f"Tool '{name}' of server '{server}' is denied by the operator")
                tool = next(t for t in tools if t.name == real)
                return ToolEntry(server, self._aliases[server], tool, aliases[real])
        raise RpcError("unknown_tool", f"Server '{server}' has no tool '{name}'")

    async def _server_record(self, server: str, granted: bool) -> dict[str, Any]:
        record = docs.server_summary(
            server, self._aliases[server], self._catalog.servers[server], granted=granted
        )
        record["tools"] = [docs.tool_record(e) for e in await self._entries(server)]
        return record

    async def _server_records(
        self, servers: list[str], call: RpcCall, timeout: float
    ) -> list[dict[str, Any]]:
        """Server records of several servers, started in parallel. A server that fails (or is not
        ready within ``timeout``) gets ``tools: []`` and an ``error`` line instead of failing all."""
        entries = await self._gather(servers, timeout)
        records = []
        for server in servers:
            record = docs.server_summary(
                server, self._aliases[server], self._catalog.servers[server], granted=server in call.grants
            )
            found = entries[server]
            record["tools"] = [docs.tool_record(e) for e in found] if isinstance(found, list) else []
            if isinstance(found, str):
                record["error"] = found
            records.append(record)
        return records

    async def _gather(self, servers: list[str], timeout: float) -> dict[str, list[ToolEntry] | str]:
        found: dict[str, list[ToolEntry] | str] = dict.fromkeys(
            servers, f"did not start within {timeout:g} s"
        )

        async def one(server: str) -> None:
            try:
                found[server] = await self._entries(server)
            except ServerFailure as exc:
                found[server] = str(exc)

        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as tg:
                for server in servers:
                    tg.start_soon(one, server)
        return found

    # -- the methods -------------------------------------------------------------------------------

    async def _manifest(self, call: RpcCall, params: dict[str, Any]) -> object:
        return {"servers": await self._server_records(self._granted(call), call, START_TIMEOUT)}

    async def _list_servers(self, call: RpcCall, params: dict[str, Any]) -> object:
        return {"servers": self._granted(call)}

    async def _discovered_servers(self, call: RpcCall, params: dict[str, Any]) -> object:
        servers = self.server_names()
        if params["detailed"]:
            return {"servers": await self._server_records(servers, call, DOCS_TIMEOUT)}
        return {
            "servers": [
                docs.server_summary(s, self._aliases[s], self._catalog.servers[s], granted=s in call.grants)
                for s in servers
            ]
        }

    async def _describe_server(self, call: RpcCall, params: dict[str, Any]) -> object:
        server = self._server(params["server"])
        try:
            return await self._server_record(server, server in call.grants)
        except ServerFailure as exc:
            raise RpcError("server_error", str(exc)) from None

    async def _list_tools(self, call: RpcCall, params: dict[str, Any]) -> object:
        server = self._server(params["server"])
        try:
            return {"tools": [docs.tool_record(e) for e in await self._entries(server)]}
        except ServerFailure as exc:
            raise RpcError("server_error", str(exc)) from None

    async def _query_tool_docs(self, call: RpcCall, params: dict[str, Any]) -> object:
        server = self._server(params["server"])
        try:
            if params["tool"] is not None:
                entries = [await self._tool(server, params["tool"])]
            else:
                entries = await self._entries(server)
        except ServerFailure as exc:
            raise RpcError("server_error", str(exc)) from None
        return {"docs": [docs.tool_doc(e, params["detail"]) for e in entries]}

    async def _search_tool_docs(self, call: RpcCall, params: dict[str, Any]) -> object:
        servers = self.server_names()
        found = await self._gather(servers, DOCS_TIMEOUT)
        entries = [e for result in found.values() if isinstance(result, list) for e in result]
        hits = docs.search(params["query"], entries, params["limit"])
        return {"results": [{**docs.tool_doc(entry), "score": score} for score, entry in hits]}

    async def _call_tool(self, call: RpcCall, params: dict[str, Any]) -> object:
        server = self._server(params["server"], call)
        try:
            entry = await self._tool(server, params["tool"])
            if self._policy.needs_approval(server, entry.tool.name):
                await self._approve(call, server, entry.tool.name, params["arguments"])
            result = await self._pool.get(server).call_tool(entry.tool.name, params["arguments"])
        except ServerFailure as exc:
            raise RpcError("server_error", str(exc)) from None
        return tool_result(result)

    async def _approve(self, call: RpcCall, server: str, tool: str, arguments: dict[str, Any]) -> None:
        """Wait for a person's decision on this call; raises the ``denied`` RpcError unless accepted.
        The wait is the call's: cancelling the call (its cell timed out) withdraws the question."""
        request = ApprovalRequest(call.session, server, tool, arguments, namespace=call.namespace)
        decision = Decision.NO_CLIENT if call.approve is None else await call.approve(request)
        who = _qualified(call.namespace, call.session)
        log.info("session %r: %s of %s.%s", who, decision.value, server, tool)
        if decision is not Decision.ACCEPTED:
            raise refusal(decision, request)

    # -- skills --------------------------------------------------------------------------------------

    def _store(self, call: RpcCall) -> Path:
        """The state directory whose ``skills/`` holds ``call``'s namespace's saved tools."""
        return namespace_state_dir(self.settings.state_dir, call.namespace)

    async def _save_tool(self, call: RpcCall, params: dict[str, Any]) -> object:
        try:
            replaced = await anyio.to_thread.run_sync(
                skills.save_skill, self._store(call), params["name"], params["source"], params["description"]
            )
        except SkillError as exc:
            raise RpcError("invalid_params", str(exc)) from None
        log.info("session %r saved skill %r", _qualified(call.namespace, call.session), params["name"])
        return {"name": params["name"], "replaced": replaced}

    async def _list_skills(self, call: RpcCall, params: dict[str, Any]) -> object:
        # Files on disk (up to MAX_SKILLS of them): read in a worker thread, never on the loop
        # every other session's messages go through.
        infos = await anyio.to_thread.run_sync(skills.list_skills, self._store(call))
        return {
            "skills": [{"name": i.name, "description": i.description, "saved_at": i.saved_at} for i in infos]
        }

    async def _load_skill(self, call: RpcCall, params: dict[str, Any]) -> object:
        try:
            skill = await anyio.to_thread.run_sync(skills.read_skill, self._store(call), params["name"])
        except SkillError as exc:
            raise RpcError("invalid_params", str(exc)) from None
        return {"name": skill.name, "source": skill.source, "description": skill.description}


def _qualified(namespace: str, session: str) -> str:
    """A session as the operator names it: ``namespace/session``, or bare in the shared namespace."""
    return f"{namespace}/{session}" if namespace else session


def tool_result(result: types.CallToolResult) -> dict[str, Any]:
    """A tool result as the plain dict sandboxed code gets (MCP's wire names, JSON values)."""
    return {
        "content": [
            block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
        ],
        "structuredContent": result.structured_content,
        "isError": bool(result.is_error),
    }
