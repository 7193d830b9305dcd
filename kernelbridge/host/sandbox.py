"""A sandbox owned by the bridge: its container, in-process tunnel, and the bridge's own client.

The bridge runs each sandbox's tunnel as tasks in its own process (no tunnel process, no runtime
client process with the engine API): the kernel's messages reach the bridge in memory, with
backpressure, and are bounded in bytes on every hop. Jupyter clients (``kernelbridge attach``, a
second client) connect to the same tunnel's ZMQ sockets through the connection file.

A :class:`Sandbox` is made of parts with one job each:

- a :class:`~kernelbridge.host.container.ContainerSource`: how it gets its container and stream
  (:meth:`Sandbox.create` creates one, durable or not; :meth:`Sandbox.adopt` reaches a durable
  one that outlived its bridge);
- its :class:`~kernelbridge.host.owner.TunnelOwner`: the life (the guarded
  :class:`~kernelbridge.host.state.SandboxState`), ready/exit, restart, close;
- ``sandbox.kernel``, a :class:`~kernelbridge.host.client.BridgeClient`: the bridge's own Jupyter
  client (requests, replies, execute);
- ``sandbox.agent``, an :class:`~kernelbridge.host.agent_calls.AgentCalls`: rpc answers and files
  in /workspace.

Driven by :meth:`Sandbox.run` in the owner's task group, with the handlers that hear it
(``await task_group.start(partial(sandbox.run, handlers))``). ``run`` returns to ``start`` only once
the kernel proved that iopub delivers (or, adopted, the sandbox proved it is the one the secret
belongs to), or raises the start failure (ImageError, AgentMismatch, KernelDied, SandboxError,
AdoptionFailed). Whatever happens, the connection file is deleted and the container removed when
``run`` ends (shielded, bounded), except a durable one that :meth:`Sandbox.detach` let go of, and
one whose adoption failed (it may be another bridge's: it ends itself after its idle timeout).

It knows nothing of sessions, cells or MCP.
"""

from __future__ import annotations

import logging
import secrets
from functools import partial
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from kernelbridge.config import Settings
from kernelbridge.host.agent_calls import AgentCalls
from kernelbridge.host.client import BridgeClient
from kernelbridge.host.container import AdoptedContainer, ContainerSource, NewContainer, container_spec
from kernelbridge.host.handlers import NO_HANDLERS, SandboxHandlers
from kernelbridge.host.owner import SHUTDOWN_GRACE, TunnelOwner
from kernelbridge.host.state import Death, SandboxState
from kernelbridge.runtime import RuntimeBackend
from kernelbridge.tunnel import Adoption, ClientExecute, Durability

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = SHUTDOWN_GRACE + 25.0
"""Bound on :meth:`Sandbox.close`: the graceful stop, then removing the container (REMOVE_TIMEOUT)."""


class Sandbox:
    """One sandboxed kernel of the bridge.

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
        self.name = name
        self.container = container
        self.durability = durability
        """Set for a sandbox that outlives its bridge (its secret is in there)."""
        self.container_id: str | None = None
        directory = connection_dir or settings.connections_dir
        self.connection_file = directory / f"kernel-{name}-{secrets.token_hex(4)}.json"
        self.owner = TunnelOwner(
            name,
            session=name,
            agent_hash=agent_hash,
            start_timeout=settings.kernel_start_timeout,
            connection_file=self.connection_file,
            durability=durability,
        )
        self.kernel = BridgeClient(self.owner.send_kernel)
        """The bridge's own client of the kernel: ``sandbox.kernel.execute(...)``, ``.reply(...)``."""
        self.agent = AgentCalls(name, self.owner.send, lambda: self.owner.alive)
        """Rpc answers and files in /workspace: ``sandbox.agent.answer_rpc(...)``, ``.files(...)``."""
        self.ended = anyio.Event()
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
        source = NewContainer(runtime, container_spec(settings, name, image, durable=durable))
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
        secret: str,
        agent_hash: str | None,
        connection_dir: Path | None = None,
    ) -> Sandbox:
        """The durable sandbox of ``container_id``, which outlived its bridge: ``run`` reaches it
        and proves this bridge knows ``secret`` (no kernel starts)."""
        source = AdoptedContainer(runtime, container_id, container_name)
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
    def state(self) -> SandboxState:
        return self.owner.state

    @property
    def alive(self) -> bool:
        return self.owner.alive

    @property
    def death(self) -> Death | None:
        return self.owner.death

    @property
    def container_name(self) -> str:
        return self.container.name

    @property
    def adoption(self) -> Adoption | None:
        """What it said about the time without a bridge, when it was adopted."""
        return self.owner.adoption

    # -- life -----------------------------------------------------------------------------------
    async def run(
        self,
        handlers: SandboxHandlers = NO_HANDLERS,
        *,
        task_status: TaskStatus[Sandbox] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Obtain the container and run its tunnel with ``handlers``; hand ``self`` to ``start()``
        once ready, then keep relaying until closed or dead. Raises the start failure before
        ``started``."""
        started = _Started(self, task_status)
        adopting = self.durability is not None and self.durability.adopting
        try:
            async with self.container.open() as container:
                self.container_id = container.id
                try:
                    await self.owner.run(
                        container,
                        peer=partial(self.kernel.deliver, handlers),
                        on_event=partial(self.agent.on_event, handlers),
                        task_status=started,
                    )
                finally:
                    # Let go of, or never proved to be ours (it may be another bridge's): kept.
                    detached = self.owner.state is SandboxState.DETACHED
                    container.keep_running = detached or (adopting and not started.done)
        finally:
            self.ended.set()
            self.kernel.end()
            self.agent.end()
            if handlers.on_end is not None:
                handlers.on_end()
            if not started.done:
                log.info("sandbox %s did not start", self.name)

    async def close(self) -> None:
        """Stop the sandbox (its state is gone) and wait until it is removed (bounded, shielded)."""
        if self.owner.request_close():
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
                await self.ended.wait()

    async def detach(self) -> bool:
        """Let go of a durable sandbox: it keeps running, with its kernel and files, for a later
        bridge to adopt. Waits (bounded, shielded) until this bridge has let go. False when it
        cannot be (not durable, not ready, or already ended): close it instead."""
        if not self.owner.request_detach():
            return False
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
            await self.ended.wait()
        return True

    def resume(self) -> None:
        """An adopted sandbox may now send what it held back (call once its handlers are ready)."""
        self.owner.resume()

    def client_execute(self, msg_id: str) -> ClientExecute | None:
        """See :meth:`TunnelOwner.client_execute`: what a Jupyter client really sent, or None."""
        return self.owner.client_execute(msg_id)

    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group (through the agent). Never waits."""
        self.owner.interrupt()

    async def restart(self, timeout: float) -> bool:
        """A new kernel in the same container (files in /workspace stay); True once it proved
        iopub delivers, False if that did not happen within ``timeout`` (or the sandbox died)."""
        return await self.owner.restart(timeout)


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
