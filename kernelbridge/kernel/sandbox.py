"""A sandbox owned by the bridge: container, in-process tunnel, and the bridge's own client.

The bridge runs each sandbox's tunnel as tasks in its own process (no tunnel process, no runtime
client process with the engine API): the kernel's messages reach the bridge in memory, with
backpressure, and are bounded in bytes on every hop. Jupyter clients (``kernelbridge attach``, a
second client) connect to the same tunnel's ZMQ sockets through the connection file.

Life of a :class:`Sandbox`, driven by :meth:`Sandbox.run` in the owner's task group
(``await task_group.start(sandbox.run)``)::

    STARTING --ready--> READY --restart()--> RESTARTING --ready--> READY
        |                 |                       |
        +-----------------+-----------------------+--> DEAD (the container or kernel ended)
                          +--close()--> CLOSED

``run`` returns to ``start`` only once the kernel proved that iopub delivers, or raises the
start failure (ImageError, AgentMismatch, KernelDied, SandboxError). Whatever happens, the
container is removed and the connection file deleted when ``run`` ends (shielded, bounded).

It knows nothing of sessions, cells or MCP: the owner sets :attr:`Sandbox.listener` (every iopub
message) and :attr:`Sandbox.rpc_handler` (every ``rpc_request`` of the sandbox's code).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import itertools
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from kernelbridge import frames
from kernelbridge.config import Settings
from kernelbridge.errors import SandboxError
from kernelbridge.kernel.launch import (
    container_spec,
    new_connection,
    start_failure,
    started_container,
    write_connection_file,
)
from kernelbridge.runtime import ContainerStream, RuntimeBackend
from kernelbridge.tunnel import ClientExecute, FrameChannel, Tunnel, memory_channel_pair

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0
"""Seconds a closing sandbox gets to stop its kernel cleanly before the container is removed."""
CONTROL_SEND_TIMEOUT = 5.0
"""Bound on handing one frame to the tunnel (it is in-process; only a wedged sandbox is slower)."""
MAX_OUTGOING_FRAMES = 10_000
"""Frames queued for a sandbox that is not reading its stdin; past this, new ones are dropped
(an rpc flood's refusals, say). Big answers are few: calls in flight are capped per session."""
FILE_TIMEOUT = 60.0
PROTOCOL_VERSION = "5.3"

KernelListener = Callable[[dict[str, Any]], Awaitable[None]]
RpcHandler = Callable[[frames.Frame], Awaitable[None]]


class SandboxState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    DEAD = "dead"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Death:
    """Why a sandbox ended."""

    kind: str
    """An exit kind of :mod:`kernelbridge.frames` (``kernel_died``, ``oom``, ``container_exited``...)."""
    reason: str
    """One line for a model or a person."""


class SandboxFileError(SandboxError):
    """A file operation on /workspace was refused (``kind``: not_found, invalid_path, too_large...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class _Waiter:
    done: anyio.Event
    reply: dict[str, Any] | None = None


class Sandbox:
    """One sandboxed kernel of the bridge. Construct, then ``await tg.start(sandbox.run)``."""

    def __init__(
        self,
        settings: Settings,
        runtime: RuntimeBackend,
        name: str,
        *,
        image: str,
        agent_hash: str | None,
        connection_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.runtime = runtime
        self.name = name
        self.image = image
        self.agent_hash = agent_hash
        self.state = SandboxState.STARTING
        self.death: Death | None = None
        self.versions: dict[str, str] = {}
        self.container_id: str | None = None
        self.spec = container_spec(settings, name, image)
        directory = connection_dir or settings.connections_dir
        self.connection_file = directory / f"kernel-{name}-{secrets.token_hex(4)}.json"
        self.listener: KernelListener | None = None
        """Gets every iopub message (the session's recorder)."""
        self.reply_listener: Callable[[dict[str, Any]], None] | None = None
        """Gets every reply to the bridge's own requests."""
        self.on_end: Callable[[], None] | None = None
        """Called once when the sandbox has ended (dead or closed)."""
        self.rpc_handler: RpcHandler | None = None
        self.session_id = uuid.uuid4().hex
        self.ended = anyio.Event()
        self._tunnel: Tunnel | None = None
        self._stream: ContainerStream | None = None
        self._control: FrameChannel | None = None
        self._ready = anyio.Event()
        self._close_requested = anyio.Event()
        self._waiters: dict[str, _Waiter] = {}
        self._file_waiters: dict[int, _Waiter] = {}
        self._file_ids = itertools.count(1)
        self._outgoing: collections.deque[frames.Frame] = collections.deque()
        self._outgoing_wakeup = anyio.Event()
        self._outgoing_dropped = 0

    def __repr__(self) -> str:
        return f"<Sandbox {self.name!r} {self.state.value}>"

    @property
    def container_name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.state in (SandboxState.READY, SandboxState.RESTARTING, SandboxState.STARTING)

    # -- life -----------------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[Sandbox] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the container and its tunnel, hand ``self`` to ``start()`` once ready, then keep
        relaying until closed or dead. Raises the start failure before ``started``."""
        owner_end, tunnel_end = memory_channel_pair()
        self._control = owner_end
        started = False
        try:
            async with started_container(self.runtime, self.spec) as (container, stream):
                self.container_id, self._stream = container, stream
                tunnel = Tunnel(
                    stream,
                    tunnel_end,
                    connection=new_connection(),
                    session=self.name,
                    kernel_key=secrets.token_hex(32),
                    agent_hash=self.agent_hash,
                    peer=self._from_kernel,
                )
                self._tunnel = tunnel
                async with anyio.create_task_group() as tg:
                    tunnel_done = anyio.Event()
                    await tg.start(self._run_tunnel, tunnel, tunnel_done)
                    assert tunnel.connection is not None
                    try:
                        write_connection_file(self.connection_file, tunnel.connection)
                    except OSError as exc:  # e.g. a full state directory: only `attach` needs it
                        log.warning("sandbox %s: no connection file: %s", self.name, exc.strerror or exc)
                    tg.start_soon(self._pump_control)
                    tg.start_soon(self._pump_outgoing)
                    await self._wait_ready(tunnel_done)
                    self.state = SandboxState.READY
                    started = True
                    task_status.started(self)
                    await _first(tunnel_done.wait, self._close_requested.wait)
                    if not tunnel_done.is_set():
                        await self._stop_gracefully(tunnel_done)
                    tg.cancel_scope.cancel()
                if self.state is not SandboxState.CLOSED:
                    await self._record_death()
        finally:
            if self.state is not SandboxState.CLOSED:
                self.state = SandboxState.DEAD
            self.ended.set()
            for waiter in [*self._waiters.values(), *self._file_waiters.values()]:
                waiter.done.set()
            if self.on_end is not None:
                self.on_end()
            with contextlib.suppress(OSError):
                self.connection_file.unlink()
            if not started:
                log.info("sandbox %s did not start", self.name)

    async def _run_tunnel(self, tunnel: Tunnel, done: anyio.Event, *, task_status: TaskStatus[None]) -> None:
        try:
            await tunnel.run(task_status=task_status)
        finally:
            done.set()

    async def _wait_ready(self, tunnel_done: anyio.Event) -> None:
        timeout = self.settings.kernel_start_timeout
        with anyio.move_on_after(timeout):
            await _first(self._ready.wait, tunnel_done.wait)
        if self._ready.is_set():
            return
        if tunnel_done.is_set():
            info = await self._inspect()
            tail = self._stream.stderr_tail() if self._stream is not None else []
            exit_frame = self._tunnel.exit_frame if self._tunnel is not None else None
            raise start_failure(exit_frame, tail, oom=bool(info and info.oom_killed))
        raise SandboxError(f"the sandbox did not become ready within {timeout:g} s")

    async def _stop_gracefully(self, tunnel_done: anyio.Event) -> None:
        """Ask the agent to stop its kernel and leave; the container is removed afterwards anyway."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE):
            self._send_control({"type": frames.SHUTDOWN})
            await tunnel_done.wait()

    async def close(self) -> None:
        """Stop the sandbox (its state is gone) and wait until it is removed (bounded)."""
        if self.state is SandboxState.DEAD or self.ended.is_set():
            self.state = SandboxState.CLOSED if self.state is not SandboxState.DEAD else self.state
            return
        self.state = SandboxState.CLOSED
        self._close_requested.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE + 25.0):
            await self.ended.wait()

    async def _record_death(self) -> None:
        exit_frame = self._tunnel.exit_frame if self._tunnel is not None else None
        info = await self._inspect()
        if info is not None and info.oom_killed:
            self.death = Death(
                frames.EXIT_OOM, "the sandbox ran out of memory (its memory limit was reached)"
            )
        elif exit_frame is not None:
            self.death = Death(str(exit_frame.get("kind")), str(exit_frame.get("reason")))
        else:
            code = info.exit_code if info is not None else None
            tail = self._stream.stderr_tail() if self._stream is not None else []
            detail = f": {tail[-1]}" if tail else ""
            status = f" with status {code}" if code is not None else ""
            self.death = Death(frames.EXIT_CONTAINER_EXITED, f"the sandbox container exited{status}{detail}")
        log.info("sandbox %s ended: %s", self.name, self.death.reason)

    async def _inspect(self) -> Any:
        if self.container_id is None:
            return None
        with anyio.CancelScope(shield=True), anyio.move_on_after(CONTROL_SEND_TIMEOUT):
            try:
                return await self.runtime.inspect(self.container_id)
            except Exception:
                log.debug("inspecting %s failed", self.container_id, exc_info=True)
        return None

    # -- events from the tunnel -------------------------------------------------------------------
    async def _pump_control(self) -> None:
        assert self._control is not None
        while True:
            try:
                frame = await self._control.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            kind = frame["type"]
            if kind == frames.READY:
                self.versions = frame.get("versions") or {}
                self.state = SandboxState.READY
                self._ready.set()
            elif kind == frames.RPC_REQUEST:
                await self._on_rpc(frame)
            elif kind == frames.FS_RESPONSE:
                self._on_file_response(frame)
            elif kind == frames.EXIT:
                pass  # the tunnel's end is what counts; it records the frame itself

    async def _on_rpc(self, frame: frames.Frame) -> None:
        if self.rpc_handler is not None:
            await self.rpc_handler(frame)
            return
        await self.answer_rpc(
            frame.get("id"), error={"kind": "unavailable", "message": "no host MCP servers in this kernel"}
        )

    async def _from_kernel(self, channel: str, msg: dict[str, Any], buffers: list[bytes]) -> None:
        if channel == "iopub":
            if self.listener is not None:
                await self.listener(msg)
            return
        if channel == "stdin":
            return  # the bridge never allows stdin; an input_request would have no one to answer
        parent = msg.get("parent_header") or {}
        waiter = self._waiters.get(parent.get("msg_id")) if isinstance(parent, dict) else None
        if waiter is not None:
            waiter.reply = msg
            waiter.done.set()
        if self.reply_listener is not None:
            self.reply_listener(msg)

    # -- the bridge's own client ------------------------------------------------------------------
    def new_message(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        header = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "kernelbridge",
            "session": self.session_id,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            "version": PROTOCOL_VERSION,
        }
        return {"header": header, "parent_header": {}, "metadata": {}, "content": content}

    async def request(
        self,
        channel: str,
        msg_type: str,
        content: dict[str, Any],
        *,
        msg_id: str | None = None,
        wait: bool = True,
    ) -> str:
        """Send a request; with ``wait`` its reply can be awaited with :meth:`reply`. Returns the
        msg_id. Raises SandboxError if the sandbox is not running or does not take the request
        within CONTROL_SEND_TIMEOUT."""
        if not self.alive or self._tunnel is None:
            raise SandboxError(f"the sandbox of {self.name!r} is not running")
        msg = self.new_message(msg_type, content)
        if msg_id is not None:
            msg["header"]["msg_id"] = msg_id
        msg_id = msg["header"]["msg_id"]
        if wait:
            self._waiters[msg_id] = _Waiter(anyio.Event())
        # Bounded: a sandbox whose stdin nobody drains (a paused container, a stopped runtime
        # client) would otherwise hold the caller forever, past any timeout it promised.
        with anyio.move_on_after(CONTROL_SEND_TIMEOUT) as scope:
            await self._tunnel.send_kernel(channel, msg)
        if scope.cancelled_caught:
            self._waiters.pop(msg_id, None)
            raise SandboxError(
                f"the sandbox did not take a request within {CONTROL_SEND_TIMEOUT:g} s "
                "(it is stopped or wedged)"
            )
        return msg_id

    async def execute(
        self,
        code: str,
        *,
        msg_id: str | None = None,
        silent: bool = False,
        store_history: bool = True,
        stop_on_error: bool = False,
        wait: bool = True,
    ) -> str:
        """Send an execute_request (``allow_stdin`` is off: nobody can answer ``input()``).
        ``wait=False``: the reply goes to :attr:`reply_listener` only."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history and not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": stop_on_error,
        }
        return await self.request("shell", "execute_request", content, msg_id=msg_id, wait=wait)

    async def reply(self, msg_id: str, timeout: float) -> dict[str, Any] | None:
        """The reply to ``msg_id`` within ``timeout`` seconds, or None (timeout, or the sandbox ended)."""
        waiter = self._waiters.get(msg_id)
        if waiter is None:
            return None
        with anyio.move_on_after(timeout):
            await waiter.done.wait()
        if waiter.done.is_set():
            self._waiters.pop(msg_id, None)
        return waiter.reply

    def forget(self, msg_id: str) -> None:
        """Stop waiting for a reply that will not be read."""
        self._waiters.pop(msg_id, None)

    def client_execute(self, msg_id: str) -> ClientExecute | None:
        """The execute_request ``msg_id`` if a Jupyter client really sent it through the tunnel's
        sockets (its verified username, session and code), taken once; None for a parent that
        nobody sent (kernel code may publish iopub under any parent it makes up)."""
        return self._tunnel.take_client_execute(msg_id) if self._tunnel is not None else None

    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group (through the agent). Bounded."""
        self._send_control({"type": frames.INTERRUPT})

    async def restart(self, timeout: float) -> bool:
        """A new kernel in the same container (files in /workspace stay); True once it proved
        iopub delivers, False if that did not happen within ``timeout`` (or the sandbox died)."""
        if not self.alive:
            return False
        self._ready = anyio.Event()
        self.state = SandboxState.RESTARTING
        with anyio.move_on_after(timeout):
            self._send_control({"type": frames.RESTART})
            await _first(self._ready.wait, self.ended.wait)
        return self._ready.is_set() and self.state is SandboxState.READY

    async def answer_rpc(
        self, request_id: object, *, result: Any = None, error: dict[str, str] | None = None
    ) -> None:
        frame: frames.Frame = {"type": frames.RPC_RESPONSE, "id": request_id}
        if error is not None:
            frame["error"] = error
        else:
            frame["result"] = result
        self._send_control(frame)

    def _send_control(self, frame: frames.Frame) -> None:
        """Queue a frame for the tunnel; it never waits for the sandbox to read it.

        Why a queue: this runs on the event pump that reads the sandbox's stdout (rpc answers are
        sent from there). If sending waited for the sandbox's stdin, and the runtime's relay of
        stdin waited for us to read stdout (conmon does: it blocks on one direction), neither side
        would move again. So the pump only queues, and :meth:`_pump_outgoing` writes.
        """
        if self._control is None or self.ended.is_set():
            return
        if len(self._outgoing) >= MAX_OUTGOING_FRAMES:
            self._outgoing_dropped += 1
            if self._outgoing_dropped in (1, 100) or self._outgoing_dropped % 10_000 == 0:
                log.warning(
                    "sandbox %s does not read its stdin: dropped %d %s frame(s)",
                    self.name, self._outgoing_dropped, frame["type"],
                )  # fmt: skip
            return
        self._outgoing.append(frame)
        self._outgoing_wakeup.set()

    async def _pump_outgoing(self) -> None:
        """Owner -> tunnel, in order, as fast as the tunnel takes frames."""
        assert self._control is not None
        while True:
            while self._outgoing:
                frame = self._outgoing.popleft()
                try:
                    await self._control.send(frame)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
            self._outgoing_wakeup = anyio.Event()
            if not self._outgoing:
                await self._outgoing_wakeup.wait()

    # -- files in /workspace ------------------------------------------------------------------------
    async def files(
        self, op: str, *, path: str = ".", data: str | None = None, timeout: float = FILE_TIMEOUT
    ) -> Any:
        """Run a file operation in the sandbox's /workspace (see ``sandbox/files.py``).
        Raises SandboxFileError (refused), SandboxError (not running, or no answer in time)."""
        if not self.alive:
            raise SandboxError(f"the sandbox of {self.name!r} is not running")
        request_id = next(self._file_ids)
        waiter = self._file_waiters[request_id] = _Waiter(anyio.Event())
        frame: frames.Frame = {"type": frames.FS_REQUEST, "id": request_id, "op": op, "path": path}
        if data is not None:
            frame["data"] = data
        try:
            with anyio.move_on_after(timeout):
                self._send_control(frame)
                await waiter.done.wait()
        finally:
            self._file_waiters.pop(request_id, None)
        answer = waiter.reply
        if answer is None:
            raise SandboxError(f"the sandbox did not answer a file request within {timeout:g} s")
        error = answer.get("error")
        if isinstance(error, dict):
            raise SandboxFileError(frames.clip(error.get("kind"), 40), frames.clip(error.get("message"), 500))
        return answer.get("result")

    def _on_file_response(self, frame: frames.Frame) -> None:
        request_id = frame.get("id")
        # Untrusted (relayed from the sandbox): an unhashable id must not end the control pump.
        waiter = self._file_waiters.get(request_id) if isinstance(request_id, int) else None
        if waiter is not None:
            waiter.reply = frame
            waiter.done.set()


async def _first(*waits: Callable[[], Awaitable[Any]]) -> None:
    """Return as soon as the first of ``waits`` returns."""
    async with anyio.create_task_group() as tg:

        async def one(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in waits:
            tg.start_soon(one, wait)
