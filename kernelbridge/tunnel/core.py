"""The tunnel: frames on a sandbox's stdio stream <-> Jupyter clients, an in-process peer, the owner.

``Tunnel(stream, control, ...)``, run in a task group, binds the Jupyter sockets, says ``hello``
(or, adopting a durable sandbox, answers its challenge), then relays until the stream ends or it
is cancelled; its last event on the control channel is always one ``Exited``. It knows nothing of
sessions, runtimes or MCP (docs/architecture.md, "The tunnel and its channels").

Every frame from the stream is untrusted: decoded within the frame cap, dropped and counted
(rate-limited logs) when the sandbox has no business sending it at that moment. Kernel code can
publish iopub under any parent it makes up: only :meth:`Tunnel.take_client_execute` says that a
Jupyter client really sent a cell.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import ByteStream, TaskStatus

from kernelbridge import frames
from kernelbridge.errors import ExitKind
from kernelbridge.ratelimit import RateLimitedLog
from kernelbridge.tunnel.channel import ControlChannel
from kernelbridge.tunnel.durable import (
    ACK_DELAY,
    Acker,
    Adoption,
    Durability,
    Handshake,
    adoption_hello,
    check_adopted,
)
from kernelbridge.tunnel.events import (
    ControlMessage,
    Detach,
    Event,
    Exited,
    FsRequest,
    FsResponse,
    Interrupt,
    Ready,
    Restart,
    Resume,
    RpcRequest,
    RpcResponse,
    Shutdown,
)
from kernelbridge.tunnel.sockets import ClientSockets
from kernelbridge.tunnel.state import Change, accepts, next_state
from kernelbridge.tunnel.state import TunnelState as TunnelState  # kernelbridge.tunnel re-exports it

log = logging.getLogger("kernelbridge.tunnel")

READ_CHUNK = 1 << 20
# Why 10 000: a client may fire requests whose replies never come (the kernel died); the map
# must not grow without bound. 10 000 outstanding requests is far beyond any real client.
MAX_PENDING = 10_000
LOG_BURST = 100
LOG_WINDOW = 10.0
"""Sandbox log lines logged per window; the rest are counted (a sandbox can send without end)."""
DROP_BURST = 20
"""Warnings about dropped frames per LOG_WINDOW; every drop is counted in ``dropped``."""
OWNER_COMMANDS = (RpcResponse, FsRequest, Interrupt, Restart, Shutdown, Detach, Resume)
"""What an owner may send to the sandbox through the tunnel."""
SANDBOX_EVENTS: dict[str, Callable[[frames.Frame], Event]] = {
    frames.READY: Ready.from_frame,
    frames.RPC_REQUEST: RpcRequest.from_frame,
    frames.FS_RESPONSE: FsResponse.from_frame,
}
BATCH_BYTES = 1 << 20
"""Owner frames gathered into one write to the sandbox's stdin."""
SEND_TIMEOUT = frames.HOST_SILENCE
"""Bound on one write to the sandbox's stdin. Its agent reads stdin whatever the kernel does (the
largest frame takes a second), so a write that takes longer means the sandbox stopped reading
(a frozen or wedged container): its stdin is given up, and every other writer, waiting for the
lock meanwhile, is held at most this long."""
STDIN_CLOSE_TIMEOUT = 5.0
"""Bound on closing the stdin given up (the sandbox's agent then sees its host leave)."""
PEER = "peer"
"""Route of a request sent by the in-process peer (instead of ZMQ identities)."""
MAX_CLIENT_EXECUTES = 64
"""Clients' execute_requests remembered until the kernel begins them (the owner takes each once);
a client that queues more than this loses the oldest records, never more memory."""
MAX_CLIENT_CODE_CHARS = 1_000_000
"""Code kept per remembered request; all of them together hold at most 4x this."""


@dataclass(frozen=True, slots=True)
class ClientExecute:
    """An ``execute_request`` a Jupyter client sent, as its verified message said."""

    username: str
    session: str
    code: str


PeerMessage = Callable[[str, dict[str, Any], list[bytes]], Awaitable[None]]
"""The in-process peer's handler: (channel, msg, buffers) for iopub and for its own replies."""


class Tunnel:
    """One sandbox's tunnel. Run :meth:`run` in a task group; talk to it through ``control``."""

    def __init__(
        self,
        stream: ByteStream,
        control: ControlChannel,
        *,
        connection: dict[str, Any] | None,
        session: str,
        kernel_key: str,
        agent_hash: str | None = None,
        peer: PeerMessage | None = None,
        durability: Durability | None = None,
    ) -> None:
        """``connection``: ports and key of the Jupyter sockets to bind (None: no sockets, only
        the peer). ``kernel_key``: the HMAC key of the kernel inside the sandbox (sent in
        ``hello``; never the connection file's key). ``durability``: a sandbox that outlives its
        bridge (new, or adopted)."""
        self.stream = stream
        self.control = control
        self.connection = connection
        self.session = session
        self.kernel_key = kernel_key
        self.agent_hash = agent_hash
        self.peer = peer
        self.durability = durability
        self.acker = Acker() if durability is not None else None
        self._ack_due = anyio.Event()
        """Frames were handled since the last ack: one is due within ACK_DELAY ..."""
        self._ack_now = anyio.Event()
        """... or at once (the acker's count or bytes say so)."""
        self._handshake: Handshake | None = None
        self.adoption: Adoption | None = None
        adopting = durability is not None and durability.adopting
        self.state = TunnelState.ADOPTING if adopting else TunnelState.STARTING
        self.clients: ClientSockets | None = None
        self.pending: collections.OrderedDict[str, list[bytes] | str] = collections.OrderedDict()
        self.client_executes: collections.OrderedDict[str, ClientExecute] = collections.OrderedDict()
        self.decoder = frames.FrameDecoder()
        self.exited: Exited | None = None
        """The agent's own exit frame, once it sent one."""
        self.dropped = 0
        self.detach_sent = anyio.Event()
        """``detach`` is written: what this bridge reads after it, the next one gets again."""
        self._send_lock = anyio.Lock()
        self._stdin_stuck = False
        """A write overran SEND_TIMEOUT: the stream may hold half a frame, nothing more goes out."""
        who = session.replace("%", "%%")
        self._sandbox_log = RateLimitedLog(
            log, f"session {who}: %d sandbox log lines suppressed", burst=LOG_BURST, window=LOG_WINDOW
        )
        self._drop_log = RateLimitedLog(
            log, f"session {who}: %d more dropped frames not logged", burst=DROP_BURST, window=LOG_WINDOW
        )

    def __repr__(self) -> str:
        return f"<Tunnel {self.session!r} {self.state.value}>"

    def _change(self, change: Change) -> None:
        """The one place the state changes. Raises IllegalTransition (a bug) for a forbidden pair."""
        self.state = next_state(self.state, change)

    # -- life -------------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bind the sockets, say hello, then relay until the stream ends. ``started`` once the
        sockets are bound (clients may connect; they are answered once the kernel is ready).

        Raises zmq.ZMQError before ``started`` if a port cannot be bound.
        """
        if self.connection is not None:
            self.clients = ClientSockets(self.connection, str(self.connection.get("key", "")).encode())
            self.clients.bind()
        try:
            if self.state is TunnelState.STARTING:
                hello: frames.Frame = {
                    "type": frames.HELLO,
                    "key": self.kernel_key,
                    "session": self.session,
                    "agent_hash": self.agent_hash,
                }
                if self.durability is not None:
                    hello["durable"] = self.durability.hello_field()
                await self.send_frame(hello)
            task_status.started()
            async with anyio.create_task_group() as tg:
                if self.clients is not None:
                    tg.start_soon(self.clients.serve, self.from_client)
                tg.start_soon(self.pump_control)
                if self.acker is not None:
                    tg.start_soon(self.heartbeat)
                await self.pump_stream()
                tg.cancel_scope.cancel()
            await self.tell_owner(self.exited or _container_exited())
        finally:
            self._change(Change.END)
            if self.clients is not None:
                self.clients.close()
            self._sandbox_log.flush()
            self._drop_log.flush()
            if self.dropped:
                log.warning(
                    "session %s: dropped %d invalid frame(s) from the sandbox", self.session, self.dropped
                )

    async def pump_stream(self) -> None:
        """Sandbox -> host until the stream ends."""
        try:
            while True:
                chunk = await self.stream.receive(READ_CHUNK)
                for item in self.decoder.feed(chunk):
                    numbered = self.acker is not None and not self.state.handshaking
                    if isinstance(item, frames.FrameError):
                        self.drop(item.reason)
                    else:
                        await self.handle(item)
                    if numbered and self.acker is not None:
                        self.acker.count()
                if self.acker is not None and self.acker.behind:
                    # The heartbeat sends the ack: this reader never waits for stdin (see
                    # :meth:`heartbeat`).
                    if self.acker.received(len(chunk)):
                        self._ack_now.set()
                    self._ack_due.set()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.info("session %s: the sandbox's stdout closed", self.session)
        except _HandshakeFailed as failed:
            log.warning("session %s: adoption failed: %s", self.session, failed.reason)
            self.exited = Exited(None, ExitKind.PROTOCOL, failed.reason)

    async def heartbeat(self) -> None:
        """Acks of a durable link: at once when the acker says so, else soon after frames were
        handled, and at least every ``frames.HEARTBEAT`` seconds (the sandbox takes silence for a
        bridge that has gone).

        Its own task, never :meth:`pump_stream`'s: an ack waits for the stdin lock, and a runtime
        that relays both directions in one loop (podman's conmon) takes no stdin while the
        sandbox's stdout is not read. A reader waiting behind a stdin write that waits for the
        reader is a deadlock (a burst of host calls whose answers fill stdin while their requests
        fill stdout)."""
        assert self.acker is not None
        while True:
            with anyio.move_on_after(frames.HEARTBEAT):
                await self._ack_due.wait()
            if self._ack_due.is_set():
                with anyio.move_on_after(ACK_DELAY):  # gather what follows into one ack
                    await self._ack_now.wait()
            if not self.state.handshaking:
                await self.send_ack()

    async def send_ack(self) -> None:
        assert self.acker is not None
        self._ack_due, self._ack_now = anyio.Event(), anyio.Event()
        await self.send_frame(self.acker.ack())

    async def pump_control(self) -> None:
        """Owner -> sandbox until the owner closes the channel. Frames that are already waiting
        go out in one write (a burst of rpc answers would otherwise cost a write, and a wake-up
        of every relay on the way, per frame)."""
        while True:
            try:
                frame = await self.control.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            batch: list[bytes] = []
            size = 0
            detaching = False
            message: ControlMessage | None = frame
            while message is not None:
                data = self.from_owner(message)
                if data:
                    batch.append(data)
                    size += len(data)
                    detaching = detaching or isinstance(message, Detach)
                message = self.control.receive_nowait() if size < BATCH_BYTES else None
            if batch:
                await self.send_bytes(b"".join(batch), f"{len(batch)} frame(s) from the owner")
            if detaching:
                self.detach_sent.set()

    def from_owner(self, command: ControlMessage) -> bytes | None:
        """The encoded frame if ``command`` is one the owner may send to the sandbox, else None
        (logged)."""
        if not isinstance(command, OWNER_COMMANDS):
            log.warning(
                "session %s: ignored a %s message from the owner", self.session, type(command).__name__
            )
            return None
        if isinstance(command, Restart):
            self._change(Change.RESTART)
        frame = command.to_frame()
        if isinstance(command, Detach) and self.acker is not None:
            frame["seq"] = self.acker.ack()["seq"]  # it goes with what was handled: nothing resent
        try:
            return frames.encode(frame)
        except (TypeError, ValueError) as exc:
            log.warning("session %s: dropped an unencodable %s frame: %s", self.session, command.TYPE, exc)
            return None

    # -- sandbox -> host ------------------------------------------------------------------------
    async def handle(self, frame: frames.Frame) -> None:
        kind = frame["type"]
        if self.state.handshaking:
            await self.handshake(frame)
            return
        if kind == frames.KERNEL:
            await self.deliver(frame)
        elif kind == frames.READY:
            if not accepts(self.state, Change.READY):
                self.drop("a ready frame while no start or restart was pending")
                return
            self._change(Change.READY)
            await self.tell_owner(Ready.from_frame(frame))
        elif kind == frames.EXIT:
            self.exited = Exited.from_frame(frame)
            log.info("session %s: sandbox exit: %s", self.session, self.exited.reason)
        elif (decode := SANDBOX_EVENTS.get(kind)) is not None:
            await self.tell_owner(decode(frame))
        elif kind == frames.LOG:
            self.log_from_sandbox(frame)
        else:
            self.drop(f"a {kind} frame is not for the host")

    async def handshake(self, frame: frames.Frame) -> None:
        """An adopted sandbox's first frames: ``challenge``, then ``adopted`` (or ``refused``).
        Anything else is not the sandbox this bridge made. Raises _HandshakeFailed."""
        assert self.durability is not None
        kind = frame["type"]
        if kind == frames.REFUSED:
            raise _HandshakeFailed(f"the sandbox refused it: {frames.clip(frame.get('reason'), 300)}")
        if self.state is TunnelState.ADOPTING and kind == frames.CHALLENGE:
            answer = adoption_hello(self.durability, frame, self.session, self.agent_hash)
            if isinstance(answer, str):
                raise _HandshakeFailed(f"the sandbox answered with garbage: {answer}")
            self._handshake = answer
            self._change(Change.CHALLENGE)
            await self.send_frame(answer.hello)
            return
        if self.state is TunnelState.PROVING and kind == frames.ADOPTED:
            assert self._handshake is not None
            problem = check_adopted(self.durability, frame, self._handshake)
            if problem is not None:
                raise _HandshakeFailed(problem)
            adoption = Adoption.from_frame(frame)
            self.adoption = adoption
            assert self.acker is not None
            self.acker.rebase(adoption.next)
            for cell in adoption.cells:  # their replies (resent, or still to come) go to the peer
                self.remember(cell.msg_id, PEER)
            self._change(Change.ADOPTED)
            agent_hash = frames.clip(frame.get("agent_hash") or "", 80)
            await self.tell_owner(Ready(dict(adoption.versions), agent_hash, adoption))
            return
        raise _HandshakeFailed(
            f"the sandbox answered with garbage (a {frames.clip(kind, 40)} frame where the adoption's"
            f" {'challenge' if self.state is TunnelState.ADOPTING else 'answer'} belongs)"
        )

    async def deliver(self, frame: frames.Frame) -> None:
        """A kernel message: iopub to the peer then the clients; a reply to whoever asked."""
        channel, msg = frame["channel"], frame["msg"]
        try:
            buffers = frames.frame_buffers(frame)
        except ValueError as exc:
            self.drop(str(exc))
            return
        if channel == "iopub":
            if self.peer is not None:
                await self.to_peer(channel, msg, buffers)
            if self.clients is not None:
                await self.clients.publish(msg, buffers)
            return
        parent = msg.get("parent_header")
        parent_id = parent.get("msg_id") if isinstance(parent, dict) else None
        if not isinstance(parent_id, str):
            return
        # Replies end a request; an input_request (stdin) answers an execute_request still running.
        route = self.pending.get(parent_id) if channel == "stdin" else self.pending.pop(parent_id, None)
        if route == PEER:
            if self.peer is not None:
                await self.to_peer(channel, msg, buffers)
        elif isinstance(route, list) and self.clients is not None:
            await self.clients.reply(channel, route, msg, buffers)

    async def to_peer(self, channel: str, msg: dict[str, Any], buffers: list[bytes]) -> None:
        """Hand a message to the in-process peer. A message the peer cannot handle is dropped
        like any other bad frame: one odd message from a sandbox must not end its tunnel."""
        assert self.peer is not None
        try:
            await self.peer(channel, msg, buffers)
        except Exception as exc:
            log.debug("session %s: the peer failed on a %s message", self.session, channel, exc_info=True)
            self.drop(f"the bridge could not handle a {channel} message ({type(exc).__name__}: {exc})")

    async def tell_owner(self, event: Event) -> None:
        try:
            await self.control.send(event)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.info("session %s: the owner is gone; dropped a %s event", self.session, event.TYPE)

    def log_from_sandbox(self, frame: frames.Frame) -> None:
        level = frames.clip(frame.get("level"), 20)
        self._sandbox_log.log(
            logging.INFO, "session %s: sandbox %s: %s", self.session, level, frames.clip(frame.get("message"))
        )

    def drop(self, reason: str) -> None:
        self.dropped += 1
        self._drop_log.log(
            logging.WARNING,
            "session %s: dropped a frame from the sandbox: %s",
            self.session,
            frames.clip(reason, 200),
        )

    # -- host -> sandbox ------------------------------------------------------------------------
    async def from_client(self, channel: str, wire: frames.WireMessage) -> None:
        """A verified message from a Jupyter client: remember who asked, forward it."""
        msg_id = wire.msg["header"].get("msg_id")
        if not isinstance(msg_id, str) or not msg_id:
            return
        self.remember(msg_id, wire.idents)
        if wire.msg["header"].get("msg_type") == "execute_request":
            self.note_client_execute(msg_id, wire.msg)
        await self.send_frame(frames.kernel_frame(channel, wire.msg, wire.buffers))

    def note_client_execute(self, msg_id: str, msg: dict[str, Any]) -> None:
        """Remember a client's (non-silent) execute_request for :meth:`take_client_execute`."""
        header, content = msg["header"], msg.get("content")
        if not isinstance(content, dict) or content.get("silent") is True:
            return  # a silent request is a client's bookkeeping, never a cell
        code = content.get("code")
        self.client_executes[msg_id] = ClientExecute(
            str(header.get("username", ""))[:64],
            str(header.get("session", ""))[:64],
            code[:MAX_CLIENT_CODE_CHARS] if isinstance(code, str) else "",
        )
        held = sum(len(c.code) for c in self.client_executes.values())
        while len(self.client_executes) > MAX_CLIENT_EXECUTES or held > 4 * MAX_CLIENT_CODE_CHARS:
            held -= len(self.client_executes.popitem(last=False)[1].code)

    def take_client_execute(self, msg_id: str) -> ClientExecute | None:
        """The execute_request ``msg_id`` if a Jupyter client sent it (and it was not taken yet)."""
        return self.client_executes.pop(msg_id, None)

    async def send_kernel(
        self, channel: str, msg: dict[str, Any], buffers: list[bytes] | None = None
    ) -> None:
        """A message from the in-process peer; its replies come back to the peer."""
        self.remember(msg["header"]["msg_id"], PEER)
        await self.send_frame(frames.kernel_frame(channel, msg, buffers or []))

    def remember(self, msg_id: str, route: list[bytes] | str) -> None:
        self.pending[msg_id] = route
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)

    async def send_frame(self, frame: frames.Frame) -> None:
        """Write one frame to the sandbox's stdin. A sandbox that is gone drops it (logged)."""
        await self.send_bytes(frames.encode(frame), f"a {frame['type']} frame")

    async def send_bytes(self, data: bytes, what: str) -> None:
        """Write ``data`` to the sandbox's stdin, one writer at a time, each bounded by
        SEND_TIMEOUT. A sandbox that is gone, or stopped reading, drops it (logged)."""
        async with self._send_lock:
            if self._stdin_stuck:
                log.debug("session %s: the sandbox's stdin was given up; dropped %s", self.session, what)
                return
            try:
                with anyio.fail_after(SEND_TIMEOUT):
                    await self.stream.send(data)
            except TimeoutError:
                await self._give_up_stdin(what)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                log.info("session %s: the sandbox's stdin is closed; dropped %s", self.session, what)

    async def _give_up_stdin(self, what: str) -> None:
        """A write overran its bound: what it wrote may end mid-frame, so nothing more is written;
        stdin is closed, so the agent sees its host leave (a durable one detaches)."""
        self._stdin_stuck = True
        log.warning(
            "session %s: the sandbox took nothing of its stdin for %g s; gave it up (dropped %s)",
            self.session,
            SEND_TIMEOUT,
            what,
        )
        with (
            anyio.move_on_after(STDIN_CLOSE_TIMEOUT),
            contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError),
        ):
            await self.stream.send_eof()


class _HandshakeFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _container_exited() -> Exited:
    reason = "the sandbox's stdout closed without an exit frame (the container ended)"
    return Exited(None, ExitKind.CONTAINER_EXITED, reason)
