"""The one owner of a sandbox's tunnel: an attached container in, a ready kernel out, until it ends.

The bridge's Sandbox and a plain Jupyter client's tunnel process both run their tunnel through it;
its state changes only through the table of :mod:`~kernelbridge.host.state`. It neither obtains the
container (a :class:`~kernelbridge.host.container.ContainerSource` does) nor knows Jupyter clients,
sessions or MCP. Closing is shielded from cancellation: a ``Shutdown``, waited for at most
:data:`SHUTDOWN_GRACE` s, then the stream closed and the container removed, bounded. A detach writes
``detach`` within :data:`DETACH_GRACE` s and leaves the container running. Design: "Shutdown
escalation" in docs/design/host.md.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import zmq
from anyio.abc import TaskStatus

from kernelbridge.errors import (
    AdoptionFailed,
    ExitKind,
    KernelBridgeError,
    PortsInUse,
    SandboxError,
    SandboxStartFailed,
    SandboxStartTimeout,
    start_error,
)
from kernelbridge.host.commands import CommandQueue
from kernelbridge.host.connection import new_connection, write_connection_file
from kernelbridge.host.container import AttachedContainer
from kernelbridge.host.state import Change, Death, SandboxState, next_state
from kernelbridge.tunnel import (
    Adoption,
    ClientExecute,
    Command,
    ControlChannel,
    Detach,
    Durability,
    Exited,
    FsResponse,
    Interrupt,
    PeerMessage,
    Ready,
    Restart,
    Resume,
    RpcRequest,
    Shutdown,
    Tunnel,
    memory_channel_pair,
)

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0
"""Seconds a closing sandbox gets to stop its kernel cleanly before the container is removed."""
DETACH_GRACE = 2.0
"""Bound on writing ``detach`` (a sandbox that reads nothing cannot hold its bridge's exit)."""
ADOPT_TIMEOUT = 15.0
"""Bound on an adoption's handshake (an exec and a challenge: ~0.1 s here; a busy engine more)."""
SEND_TIMEOUT = 5.0
"""Bound on handing one kernel message to the tunnel (it is in-process; only a wedged sandbox is
slower: a paused container, a runtime client that stopped draining its stdin)."""

AgentEvent = RpcRequest | FsResponse
EventHandler = Callable[[AgentEvent], Awaitable[None]]
"""Gets the events the owner does not handle itself; must return soon (it runs on the event pump)."""


class TunnelOwner:
    """Runs one sandbox's tunnel. ``await tg.start(partial(owner.serve, container, ...))``."""

    def __init__(
        self,
        name: str,
        *,
        session: str,
        agent_hash: str | None,
        start_timeout: float,
        connection: dict[str, Any] | None = None,
        connection_file: Path | None = None,
        durability: Durability | None = None,
    ) -> None:
        """``session``: what the agent is told in ``hello``. ``connection``: the Jupyter ports and
        key to bind (None: fresh ones, ports chosen by ZMQ). ``connection_file``: where to write the
        bound connection (0600), deleted when the sandbox ends; None: not written here.
        ``durability``: the sandbox outlives its bridge (a new one, or one to adopt)."""
        self.name = name
        """For logs and errors (the sandbox's name)."""
        self.session = session
        self.agent_hash = agent_hash
        """The agent the host expects in the image (None: any, e.g. the local test double)."""
        self.start_timeout = start_timeout
        """Seconds from attaching to ``ready``, at the start and for each restart it is asked for."""
        self.connection_file = connection_file
        self.durability = durability
        self.state = SandboxState.STARTING
        self.ready: Ready | None = None
        """The latest ``ready`` (versions, agent hash)."""
        self.exited: Exited | None = None
        """The tunnel's last event: how the sandbox ended, as the agent (or the tunnel) said."""
        self.death: Death | None = None
        """Why it ended by itself (DEAD); None while alive, after a close, or a failed start."""
        self.ended = anyio.Event()
        self.commands = CommandQueue(name)
        self._connection = connection
        self._tunnel: Tunnel | None = None
        self._ready = anyio.Event()
        self._tunnel_ended = anyio.Event()
        self._close_requested = anyio.Event()
        self._detach_requested = anyio.Event()
        self._wrote_file = False

    def __repr__(self) -> str:
        return f"<TunnelOwner {self.name!r} {self.state.value}>"

    @property
    def alive(self) -> bool:
        return self.state.alive

    @property
    def adoption(self) -> Adoption | None:
        """What an adopted sandbox said about the time without a bridge (None: not adopted)."""
        return self.ready.adoption if self.ready is not None else None

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.ready.versions) if self.ready is not None else {}

    @property
    def connection(self) -> dict[str, Any] | None:
        """The bound connection info (ports filled in) once the tunnel runs."""
        return self._tunnel.connection if self._tunnel is not None else self._connection

    def _change(self, change: Change) -> SandboxState:
        """The one place the state changes. Raises IllegalTransition (a bug) for a forbidden pair."""
        self.state = next_state(self.state, change)
        return self.state

    # -- life -----------------------------------------------------------------------------------
    async def serve(
        self,
        container: AttachedContainer,
        *,
        peer: PeerMessage | None,
        on_event: EventHandler,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the tunnel on ``container`` until the sandbox ends or is closed; ``started`` once its
        kernel proved iopub delivers. ``peer`` gets the kernel's iopub and the replies to its own
        requests (the bridge's client); ``on_event`` gets rpc requests and file answers.

        Raises, before ``started``, the start failure of :func:`~kernelbridge.errors.start_error`
        (AgentMismatch, ImageError, KernelDied, SandboxStartFailed, SandboxStartTimeout).
        """
        owner_end, tunnel_end = memory_channel_pair()
        tunnel = Tunnel(
            container.stream,
            tunnel_end,
            connection=self._connection if self._connection is not None else new_connection(),
            session=self.session,
            kernel_key=secrets.token_hex(32),
            agent_hash=self.agent_hash,
            peer=peer,
            durability=self.durability,
        )
        self._tunnel = tunnel
        failure: KernelBridgeError | None = None
        try:
            async with anyio.create_task_group() as tg:
                # A start failure is raised after the group is left: raised inside it, it would
                # reach the caller wrapped in an ExceptionGroup.
                try:
                    await tg.start(_run_tunnel, tunnel)
                    self._wrote_file = self._write_connection_file()
                    tg.start_soon(self._pump_events, owner_end, on_event)
                    tg.start_soon(self.commands.pump, owner_end)
                    await self._wait_ready(container)
                except zmq.ZMQError as exc:
                    error = PortsInUse if exc.errno == zmq.EADDRINUSE else SandboxStartFailed
                    failure = error(f"cannot bind the kernel ports: {exc}")
                except KernelBridgeError as exc:
                    failure = exc
                if failure is None:
                    task_status.started()
                    await _first(
                        self._tunnel_ended.wait, self._close_requested.wait, self._detach_requested.wait
                    )
                    if self.state is SandboxState.DETACHING:
                        await self._let_go()
                    else:
                        await self._stop_gracefully()
                tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            # Ended by itself, closed or detached: tell which before anyone sees the state change
            # (a death found while the state is still alive, as the inspection may take a moment).
            death = await self._death(container) if self.state.alive else None
            if self._change(Change.END) is SandboxState.DEAD:
                self.death = death
                log.info("sandbox %s ended: %s", self.name, death.reason if death else "?")
        finally:
            if self.state.alive or self.state in (SandboxState.CLOSING, SandboxState.DETACHING):
                self._change(Change.END)  # a failed start, or cancelled
            self.commands.close()
            self.ended.set()
            if self._wrote_file and self.connection_file is not None:
                with contextlib.suppress(OSError):
                    self.connection_file.unlink()

    def _write_connection_file(self) -> bool:
        if self.connection_file is None or self.connection is None:
            return False
        try:
            write_connection_file(self.connection_file, self.connection)
        except OSError as exc:  # e.g. a full state directory: only Jupyter clients need it
            log.warning("sandbox %s: no connection file: %s", self.name, exc.strerror or exc)
            return False
        return True

    async def _wait_ready(self, container: AttachedContainer) -> None:
        adopting = self.durability is not None and self.durability.adopting
        timeout = min(self.start_timeout, ADOPT_TIMEOUT) if adopting else self.start_timeout
        with anyio.move_on_after(timeout):
            await _first(self._ready.wait, self._tunnel_ended.wait, self._close_requested.wait)
        if self._ready.is_set():
            return
        if adopting:
            raise AdoptionFailed(await self._adoption_failure(container, timeout))
        if self._tunnel_ended.is_set():
            info = await container.inspect()
            exited = self.exited
            tail = container.stream.stderr_tail()
            raise start_error(
                exited.kind if exited is not None else None,
                exited.reason if exited is not None else "",
                detail=next((line for line in reversed(tail) if line.strip()), ""),
                oom=bool(info and info.oom_killed),
            )
        if self._close_requested.is_set():
            raise SandboxStartFailed("it was closed while it started")
        raise SandboxStartTimeout(f"the sandbox did not become ready within {self.start_timeout:g} s")

    async def _adoption_failure(self, container: AttachedContainer, timeout: float) -> str:
        """Why an adoption did not complete, in one line."""
        if self._close_requested.is_set():
            return "it was closed meanwhile"
        if not self._tunnel_ended.is_set():
            return f"the sandbox did not answer within {timeout:g} s"
        exited = self.exited
        if exited is not None and exited.kind is ExitKind.PROTOCOL:
            return exited.reason
        tail = [line for line in container.stream.stderr_tail() if line.strip()]
        info = await container.inspect()
        if info is not None and info.exit_code is not None:
            return f"its container exited (status {info.exit_code})"
        said = f" ({tail[-1]})" if tail else ""
        return f"the sandbox closed the attachment without a word{said}"

    async def _let_go(self) -> None:
        """Detach (module docstring): ``detach``, and done once it is written. The stream never
        ends by itself here: the agent points its stdio at /dev/null and runs on, so waiting for
        its end would cost every durable bridge's exit the whole grace."""
        tunnel = self._tunnel
        if tunnel is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(DETACH_GRACE):
            self.commands.put(Detach())
            await _first(self._tunnel_ended.wait, tunnel.detach_sent.wait)

    async def _stop_gracefully(self) -> None:
        """Step 1 of the shutdown escalation (module docstring): ask, wait at most SHUTDOWN_GRACE."""
        if self._tunnel_ended.is_set():
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE):
            self.commands.put(Shutdown())
            await self._tunnel_ended.wait()

    async def _death(self, container: AttachedContainer) -> Death:
        info = await container.inspect()
        exited = self.exited
        if info is not None and info.oom_killed:
            return Death(ExitKind.OOM, "the sandbox ran out of memory (its memory limit was reached)")
        if info is not None and info.reason:  # the runtime ended it (a cluster evicting its pod)
            return Death(ExitKind.CONTAINER_EXITED, f"the sandbox ended: {info.reason}")
        if exited is not None and exited.kind is not ExitKind.CONTAINER_EXITED:
            return Death(exited.kind, exited.reason)
        code = info.exit_code if info is not None else None
        tail = container.stream.stderr_tail()
        detail = f": {tail[-1]}" if tail else ""
        status = f" with status {code}" if code is not None else ""
        return Death(ExitKind.CONTAINER_EXITED, f"the sandbox container exited{status}{detail}")

    def request_close(self) -> bool:
        """Ask the sandbox to stop (its state is gone); True if it was running and now stops
        (wait for :attr:`ended`), False if it had ended already."""
        if self._change(Change.CLOSE) is not SandboxState.CLOSING or self.ended.is_set():
            return False
        self._close_requested.set()
        return True

    def request_detach(self) -> bool:
        """Let go of a durable sandbox: it keeps running for a later bridge. True if it was
        running and is now being let go of (wait for :attr:`ended`)."""
        if self.durability is None or self.ended.is_set():
            return False
        if self._change(Change.DETACH) is not SandboxState.DETACHING:
            return False
        self._detach_requested.set()
        return True

    def resume(self) -> None:
        """An adopted sandbox may send what it held back (the session is ready to hear it)."""
        self.send(Resume())

    async def close(self) -> None:
        """:meth:`request_close`, then wait until the tunnel ended (bounded, shielded)."""
        if self.request_close():
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE + SEND_TIMEOUT):
                await self.ended.wait()

    # -- events from the tunnel -------------------------------------------------------------------
    async def _pump_events(self, channel: ControlChannel, on_event: EventHandler) -> None:
        """Tunnel -> owner until the tunnel's last event (its Exited)."""
        try:
            while True:
                try:
                    event = await channel.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                if isinstance(event, Ready):
                    self._on_ready(event)
                elif isinstance(event, Exited):
                    self.exited = event
                    return
                elif isinstance(event, (RpcRequest, FsResponse)):
                    await on_event(event)
                else:
                    log.warning("sandbox %s: ignored a %s from the tunnel", self.name, event.TYPE)
        finally:
            self._tunnel_ended.set()

    def _on_ready(self, ready: Ready) -> None:
        if self._change(Change.READY) is SandboxState.READY:
            self.ready = ready
            self._ready.set()
        else:
            log.info("sandbox %s: a ready arrived while it was %s; ignored", self.name, self.state.value)

    # -- commands -----------------------------------------------------------------------------------
    def send(self, command: Command) -> None:
        """Queue a command for the sandbox (never waits; dropped once it ended)."""
        self.commands.put(command)

    async def send_kernel(self, channel: str, msg: dict[str, Any]) -> None:
        """A kernel message from the in-process peer (its replies come back to the peer).
        Raises SandboxError if the sandbox is not running or does not take the message within
        SEND_TIMEOUT (bounded: a sandbox whose stdin nobody drains would otherwise hold the
        caller forever, past any timeout it promised)."""
        if not self.alive or self._tunnel is None:
            raise SandboxError(f"the sandbox of {self.name!r} is not running")
        with anyio.move_on_after(SEND_TIMEOUT) as scope:
            await self._tunnel.send_kernel(channel, msg)
        if scope.cancelled_caught:
            raise SandboxError(
                f"the sandbox did not take a request within {SEND_TIMEOUT:g} s (it is stopped or wedged)"
            )

    def client_execute(self, msg_id: str) -> ClientExecute | None:
        """The execute_request ``msg_id`` if a Jupyter client really sent it through the tunnel's
        sockets (its verified username, session and code), taken once; None for a parent that
        nobody sent (kernel code may publish iopub under any parent it makes up)."""
        return self._tunnel.take_client_execute(msg_id) if self._tunnel is not None else None

    def interrupt(self) -> None:
        """SIGINT to the kernel's process group (through the agent)."""
        if self.alive:
            self.send(Interrupt())

    async def restart(self, timeout: float) -> bool:
        """A new kernel in the same container (files in /workspace stay); True once it proved
        iopub delivers, False if that did not happen within ``timeout`` (or the sandbox ended
        or is closing meanwhile)."""
        if self.state not in (SandboxState.READY, SandboxState.RESTARTING):
            return False
        self._ready = anyio.Event()
        self._change(Change.RESTART)
        with anyio.move_on_after(timeout):
            self.send(Restart())
            await _first(self._ready.wait, self._tunnel_ended.wait)
        return self._ready.is_set() and self.state is SandboxState.READY


async def _run_tunnel(tunnel: Tunnel, *, task_status: TaskStatus[None]) -> None:
    await tunnel.run(task_status=task_status)


async def _first(*waits: Callable[[], Awaitable[Any]]) -> None:
    """Return as soon as the first of ``waits`` returns."""
    async with anyio.create_task_group() as tg:

        async def one(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in waits:
            tg.start_soon(one, wait)
