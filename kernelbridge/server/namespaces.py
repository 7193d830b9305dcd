"""Sessions by namespace: one :class:`~kernelbridge.session.registry.SessionRegistry` per HTTP token.

Over stdio (and HTTP without authentication) there is one namespace, ``""``, with the bridge's own
settings; each token's namespace has its own registry and state directory
(:func:`kernelbridge.config.namespace_state_dir`). There is no lookup across namespaces: a client
never sees, lists, closes, exports or attaches to another's sessions. The registries are created
when the bridge starts and closed together, in parallel, when it stops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import TYPE_CHECKING

import anyio

from kernelbridge.config import Settings, namespace_state_dir
from kernelbridge.errors import SessionError

if TYPE_CHECKING:
    from kernelbridge.session.registry import SessionRegistry


def namespace_settings(base: Settings, namespace: str) -> Settings:
    """The settings of ``namespace``'s registry (``base`` itself for the shared namespace)."""
    if not namespace:
        return base
    return dataclasses.replace(
        base,
        state_dir=namespace_state_dir(base.state_dir, namespace),
        namespace=namespace,
        max_sessions=min(base.http.max_sessions, base.max_sessions),
        # An operator's export directory is shared by the clients: each writes below its own name.
        export_dir=base.export_dir / namespace if base.export_dir else None,
        disk_quota=base.http.disk_quota,
    )


class Namespaces:
    """The registries of one bridge. ``async with Namespaces(...)`` opens every one of them."""

    def __init__(
        self,
        base: Settings,
        names: list[str],
        make_registry: Callable[[Settings], SessionRegistry],
        *,
        max_calls: int | None,
    ) -> None:
        self.base = base
        self.names = names
        self.max_calls = max_calls
        self._make = make_registry
        self._registries: dict[str, SessionRegistry] = {}
        self._calls: dict[str, int] = {}
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Namespaces:
        async with AsyncExitStack() as stack:
            for name in self.names:  # each registry creates its directory (its SessionStore's)
                settings = namespace_settings(self.base, name)
                self._registries[name] = await stack.enter_async_context(self._make(settings))
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Each registry's teardown is bounded on its own; run them side by side so that many
        # tokens do not multiply the time a bridge takes to stop.
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for registry in self._registries.values():
                    tg.start_soon(registry.aclose)
        await self._stack.aclose()

    def leave(self) -> None:
        for registry in self._registries.values():
            registry.leave()

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until every registry adopted what a bridge before left."""
        async with anyio.create_task_group() as tg:
            for registry in self._registries.values():
                tg.start_soon(registry.settle, timeout)

    def registry(self, namespace: str) -> SessionRegistry:
        """The registry of ``namespace``. Raises SessionError for a namespace this bridge does not
        serve (a request that reached a tool without the token the bridge requires)."""
        try:
            return self._registries[namespace]
        except KeyError:
            raise SessionError("this bridge serves authenticated clients only") from None

    def settings(self, namespace: str) -> Settings:
        self.registry(namespace)  # only namespaces this bridge serves
        return namespace_settings(self.base, namespace)

    def check_new_session(self, namespace: str, session: str) -> None:
        """Refuse a new session when the whole bridge is at ``KERNELBRIDGE_MAX_SESSIONS`` (each
        registry only knows its own). Call right before the registry creates it: there is no
        await in between, so the count cannot change meanwhile."""
        if len(self._registries) < 2 or self.registry(namespace).session(session) is not None:
            return
        total = sum(len(registry.describe()) for registry in self._registries.values())
        if total >= self.base.max_sessions:
            raise SessionError(
                f"the bridge is at its limit of {self.base.max_sessions} sessions over all clients;"
                " close one of yours with close_session or try again later"
            )

    @contextmanager
    def call(self, namespace: str) -> Iterator[None]:
        """Count one tool call of ``namespace`` in flight; SessionError past ``max_calls``."""
        running = self._calls.get(namespace, 0)
        if self.max_calls is not None and running >= self.max_calls:
            raise SessionError(
                f"{running} calls of this client are already running (the limit is {self.max_calls});"
                " wait for one to finish"
            )
        self._calls[namespace] = running + 1
        try:
            yield
        finally:
            self._calls[namespace] -= 1
