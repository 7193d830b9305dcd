"""A sandbox of the bridge: a :class:`~kernelbridge.host.owner.TunnelOwner` (its life, ready/exit,
restart, close) with how it gets its container (:meth:`Sandbox.create` a new one, or
:meth:`Sandbox.adopt` a durable one that outlived its bridge), the bridge's own Jupyter client of
its kernel (``sandbox.kernel``) and the agent's calls (``sandbox.agent``: rpc answers, files).

``await tg.start(partial(sandbox.run, handlers))`` returns once the kernel proved iopub delivers
(or, adopted, the sandbox proved it is the one the secret belongs to), or raises the start
failure. When ``run`` ends the connection file is deleted and the container removed (shielded,
bounded), except a durable one that :meth:`Sandbox.detach` let go of, and one whose adoption
failed (it may be another bridge's). It knows nothing of sessions, cells or MCP.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from kernelbridge.config import Settings
from kernelbridge.host.agent_calls import AgentCalls
from kernelbridge.host.client import BridgeClient
from kernelbridge.host.container import AdoptedContainer, ContainerSource, NewContainer, container_spec
from kernelbridge.host.handlers import NO_HANDLERS, SandboxHandlers
from kernelbridge.host.owner import SHUTDOWN_GRACE, AgentEvent, TunnelOwner
from kernelbridge.host.state import SandboxState
from kernelbridge.runtime import RuntimeBackend
from kernelbridge.tunnel import Durability

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = SHUTDOWN_GRACE + 25.0
"""Bound on :meth:`Sandbox.close`: the graceful stop, then removing the container (REMOVE_TIMEOUT)."""


class Sandbox(TunnelOwner):
    """One sandboxed kernel of the bridge: a :class:`TunnelOwner` with its container source, the
    bridge's own client of the kernel (``kernel``) and the agent's calls (``agent``).

    :meth:`create` it, then ``await tg.start(partial(sandbox.run, handlers))``.
    """

    def __init__(
        self,
        settings: Settings,
        container: ContainerSource,
        name: str,
        *,
        agent_hash: str | None,
        connection_dir: Path | None = None,
        durability: Durability | None = None,
    ) -> None:
        directory = connection_dir or settings.connections_dir
        super().__init__(
            name,
            session=name,
            agent_hash=agent_hash,
            start_timeout=settings.kernel_start_timeout,
            connection_file=directory / f"kernel-{name}-{secrets.token_hex(4)}.json",
            durability=durability,
        )
        self.container = container
        self.container_id: str | None = None
        self.kernel = BridgeClient(self.send_kernel)
        """The bridge's own client of the kernel: ``sandbox.kernel.execute(...)``, ``.reply(...)``."""
        self.agent = AgentCalls(self)
        """Rpc answers and files in /workspace: ``sandbox.agent.answer_rpc(...)``, ``.files(...)``."""
        self.handlers = NO_HANDLERS
        """Who hears it (:meth:`listen`)."""
        self.gone = anyio.Event()
        """Set once the sandbox has ended and its container is gone (or left for reaping)."""

    @classmethod
    def create(
        cls,
        settings: Settings,
        runtime: RuntimeBackend,
        name: str,
        *,
        image: str,
        agent_hash: str | None,
        connection_dir: Path | None = None,
        durable: bool = False,
    ) -> Sandbox:
        """A sandbox in a new container of ``image`` (created when it runs, removed after, unless
        ``durable`` and let go of: then it outlives its bridge, with a fresh secret)."""
        spec = container_spec(settings, name, image, agent_hash=agent_hash, durable=durable)
        source = NewContainer(runtime, spec)
        durability = new_durability(settings) if durable else None
        return cls(
            settings,
            source,
            name,
            agent_hash=agent_hash,
            connection_dir=connection_dir,
            durability=durability,
        )

    @classmethod
    def adopt(
        cls,
        settings: Settings,
        runtime: RuntimeBackend,
        name: str,
        *,
        container_id: str,
        container_name: str,
        container_label: str,
        secret: str,
        agent_hash: str | None,
        connection_dir: Path | None = None,
    ) -> Sandbox:
        """The durable sandbox of ``container_id`` (labelled ``container_label``), which outlived
        its bridge: ``run`` reaches it and proves this bridge knows ``secret`` (no kernel starts)."""
        source = AdoptedContainer(runtime, container_id, container_name, container_label)
        durability = Durability(secret, settings.idle_timeout, settings.detached_buffer, adopting=True)
        return cls(
            settings,
            source,
            name,
            agent_hash=agent_hash,
            connection_dir=connection_dir,
            durability=durability,
        )

    def __repr__(self) -> str:
        return f"<Sandbox {self.name!r} {self.state.value}>"

    @property
    def container_name(self) -> str:
        return self.container.name

    @property
    def container_label(self) -> str:
        """Who its container was started for (:attr:`ContainerSource.label`)."""
        return self.container.label

    # -- life -----------------------------------------------------------------------------------
    async def run(
        self,
        handlers: SandboxHandlers = NO_HANDLERS,
        *,
        task_status: TaskStatus[Sandbox] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Obtain the container and run its tunnel, heard by ``handlers`` (until :meth:`listen`
        gives it others); hand ``self`` to ``start()`` once ready, then keep relaying until
        closed or dead. Raises the start failure before ``started``."""
        self.handlers = handlers
        started = _Started(self, task_status)
        adopting = self.durability is not None and self.durability.adopting
        try:
            async with self.container.open() as container:
                self.container_id = container.id
                try:
                    await self.serve(
                        container, peer=self._deliver, on_event=self._on_event, task_status=started
                    )
                finally:
                    # Let go of, or never proved to be ours (it may be another bridge's): kept.
                    detached = self.state is SandboxState.DETACHED
                    container.keep_running = detached or (adopting and not started.done)
        finally:
            self.gone.set()
            self.kernel.end()
            self.agent.end()
            if self.handlers.on_end is not None:
                self.handlers.on_end()
            if not started.done:
                log.info("sandbox %s did not start", self.name)

    def listen(self, handlers: SandboxHandlers) -> None:
        """From now on ``handlers`` hear it (a session took a sandbox the warm pool started)."""
        self.handlers = handlers

    async def _deliver(self, channel: str, msg: dict[str, Any], buffers: list[bytes]) -> None:
        await self.kernel.deliver(self.handlers, channel, msg, buffers)

    async def _on_event(self, event: AgentEvent) -> None:
        await self.agent.on_event(self.handlers, event)

    async def close(self) -> None:
        """Stop the sandbox (its state is gone) and wait until it is removed (bounded, shielded)."""
        if self.request_close():
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
                await self.gone.wait()

    async def detach(self) -> bool:
        """Let go of a durable sandbox: it keeps running, with its kernel and files, for a later
        bridge to adopt. Waits (bounded, shielded) until this bridge has let go. False when it
        cannot be (not durable, not ready, or already ended): close it instead."""
        if not self.request_detach():
            return False
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
            await self.gone.wait()
        return True


def new_durability(settings: Settings) -> Durability:
    """A new durable sandbox's: a fresh secret (only the state directory and the agent know it)."""
    return Durability(secrets.token_hex(32), settings.idle_timeout, settings.detached_buffer)


class _Started(TaskStatus[None]):
    """The owner's ``started()`` hands the sandbox itself to whoever started :meth:`Sandbox.run`."""

    def __init__(self, sandbox: Sandbox, task_status: TaskStatus[Sandbox]) -> None:
        self.sandbox = sandbox
        self.task_status = task_status
        self.done = False

    def started(self, value: None = None) -> None:
        self.done = True
        self.task_status.started(self.sandbox)
