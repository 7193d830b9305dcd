"""The host end of the tunnel: real ZMQ kernel sockets on 127.0.0.1 <-> frames on a container's stdio.

Runs as its own small process per sandbox (``python -m kernelbridge.tunnel``), started by the
kernel provisioner, so that any Jupyter client (the bridge, ``jupyter console --existing``,
nbclient) sees an ordinary kernel behind an ordinary connection file::

    clients --ZMQ (host key)--> [tunnel process] --frames on stdin--> podman run -i ... agent --> ipykernel
    clients <--ZMQ (host key)-- [tunnel process] <--frames on stdout-- (container)

What it owns
- Binds shell/control/stdin (ROUTER), iopub (PUB) and heartbeat (echo) on the connection file's
  ports. Incoming messages must carry a valid HMAC with the connection file's key; the kernel
  in the container gets a *different* key (sent in the ``hello`` frame), so the host key never
  enters the sandbox.
- Routes each reply (and each ``input_request``) back to the client identity that sent the
  request, by the request's msg_id. Any number of clients can be connected at once.
- Treats every frame from the container as untrusted: bad frames are logged and dropped.
- Turns SIGINT into an ``interrupt`` frame, SIGUSR1 into a ``restart`` (a new kernel in the same
  container) and SIGTERM into a graceful ``shutdown``.
- Prints JSON events on its own stdout for the provisioner: ``{"event": "ready", ...}`` each time
  the agent has proven that iopub delivers (at start and after a restart), and
  ``{"event": "exit", "status", "reason"}`` at the end.

It knows nothing of sessions, notebooks or MCP.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import logging.handlers
import os
import secrets
import signal
import sys
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.asyncio
from anyio.abc import Process

from kernelbridge import frames

log = logging.getLogger("kernelbridge.tunnel")

ROUTED_CHANNELS = ("shell", "control", "stdin")
# Why 10 000: a client may fire requests whose replies never come (the kernel died); the map
# must not grow without bound. 10 000 outstanding requests is far beyond any real client.
MAX_PENDING = 10_000
READ_CHUNK = 1 << 20
# Container stop: the agent gets `shutdown`, then the runtime client gets SIGTERM, then SIGKILL.
SHUTDOWN_GRACE = 3.0
KILL_GRACE = 2.0
STDERR_GRACE = 1.0
LOG_FILE_BYTES = 1024 * 1024
REMOVE_TIMEOUT = 20.0


class Tunnel:
    def __init__(
        self,
        connection: dict[str, Any],
        argv: list[str],
        agent_hash: str | None,
        session: str,
        container_name: str | None = None,
    ):
        self.connection = connection
        self.container_name = container_name
        self.argv = argv
        self.agent_hash = agent_hash
        self.session = session
        self.host_key = str(connection.get("key", "")).encode()
        self.sandbox_key = secrets.token_hex(32)
        self.ctx = zmq.asyncio.Context()
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        self.pending: OrderedDict[str, list[bytes]] = OrderedDict()
        self.decoder = frames.FrameDecoder()
        self.process: Process | None = None
        self.exit_event: dict[str, Any] | None = None
        self.dropped_frames = 0
        self._send_lock = anyio.Lock()
        self.stderr_tail: list[str] = []
        self.stderr_done = anyio.Event()

    # -- sockets ------------------------------------------------------------------------------
    def bind(self) -> None:
        ip = self.connection.get("ip", "127.0.0.1")
        kinds = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER, "iopub": zmq.PUB}
        for channel, kind in kinds.items():
            sock = self.ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            if kind == zmq.ROUTER:
                # Don't silently drop a reply to a client that went away and came back.
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            sock.bind(f"tcp://{ip}:{self.connection[f'{channel}_port']}")
            self.sockets[channel] = sock
        threading.Thread(
            target=_heartbeat, args=(f"tcp://{ip}:{self.connection['hb_port']}",), daemon=True
        ).start()

    async def pump_socket(self, channel: str) -> None:
        """Client -> sandbox: verify, remember who asked, forward as a kernel frame."""
        sock = self.sockets[channel]
        while True:
            parts = await sock.recv_multipart()
            try:
                wire = frames.from_wire(parts)
            except ValueError as exc:
                log.warning("dropped a malformed %s message: %s", channel, exc)
                continue
            if not frames.verify(self.host_key, wire):
                log.warning("dropped %s message with a bad signature", channel)
                continue
            msg_id = wire.msg["header"].get("msg_id")
            if not msg_id:
                continue
            self.remember(msg_id, wire.idents)
            await self.send_frame(frames.kernel_frame(channel, wire.msg, wire.buffers))

    def remember(self, msg_id: str, idents: list[bytes]) -> None:
        self.pending[msg_id] = idents
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)

    async def deliver(self, frame: frames.Frame) -> None:
        """Sandbox -> clients: sign with the host key and route."""
        channel, msg = frame["channel"], frame["msg"]
        try:
            wire = frames.to_wire(msg, frames.frame_buffers(frame), self.host_key)
        except (ValueError, TypeError) as exc:
            self.drop(f"bad kernel frame: {exc}")
            return
        if channel == "iopub":
            msg_type = str(msg["header"].get("msg_type", ""))
            await self.sockets["iopub"].send_multipart([f"kernel.{msg_type}".encode(), *wire])
            return
        parent = msg.get("parent_header")
        parent_id = parent.get("msg_id") if isinstance(parent, dict) else None
        # Replies end a request; an input_request (stdin) answers an execute_request still running.
        idents = self.pending.get(parent_id) if channel == "stdin" else self.pending.pop(parent_id, None)
        if idents is None:
            log.debug("no client waits for a %s reply to %s", channel, parent_id)
            return
        await self.sockets[channel].send_multipart([*idents, *wire])

    # -- frames -------------------------------------------------------------------------------
    async def send_frame(self, frame: frames.Frame) -> None:
        assert self.process is not None and self.process.stdin is not None
        data = frames.encode(frame)
        async with self._send_lock:
            try:
                await self.process.stdin.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                log.info("sandbox stdin closed; dropped a %s frame", frame["type"])

    def drop(self, reason: str) -> None:
        self.dropped_frames += 1
        log.warning("dropped frame from sandbox: %s", reason)

    async def pump_stdout(self, ready: anyio.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                chunk = await self.process.stdout.receive(READ_CHUNK)
                for item in self.decoder.feed(chunk):
                    if isinstance(item, frames.FrameError):
                        self.drop(item.reason)
                    else:
                        await self.handle(item, ready)

    async def handle(self, frame: frames.Frame, ready: anyio.Event) -> None:
        kind = frame["type"]
        if kind == frames.KERNEL:
            await self.deliver(frame)
        elif kind == frames.READY:  # the first kernel, or a new one after a restart
            log.info("sandbox ready: %s", frame.get("versions"))
            emit({"event": "ready", "versions": frame.get("versions"), "agent_hash": frame.get("agent_hash")})
            ready.set()
        elif kind == frames.EXIT:
            log.info("sandbox exit: %s", frame.get("reason"))
            self.exit_event = {
                "event": "exit",
                "status": frame.get("status"),
                "reason": str(frame.get("reason")),
            }
        elif kind == frames.LOG:
            log.info("sandbox %s: %s", frame.get("level"), str(frame.get("message"))[:2000])
        else:
            self.drop(f"unexpected {kind} frame")

    async def pump_stderr(self) -> None:
        """The runtime client's stderr, logged; the last lines explain a failed start."""
        assert self.process is not None and self.process.stderr is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            async for chunk in self.process.stderr:
                for line in chunk.decode(errors="replace").splitlines():
                    log.info("runtime: %s", line)
                    self.stderr_tail = [*self.stderr_tail[-19:], line]
        self.stderr_done.set()

    # -- lifecycle ----------------------------------------------------------------------------
    async def handle_signals(self, signals: AsyncIterator[int], scope: anyio.CancelScope) -> None:
        async for signum in signals:
            if signum == signal.SIGINT:
                await self.send_frame({"type": frames.INTERRUPT})
            elif signum == signal.SIGUSR1:
                log.info("restarting the kernel in its container")
                await self.send_frame({"type": frames.RESTART})
            else:
                await self.send_frame({"type": frames.SHUTDOWN})
                await self.stop_process()
                scope.cancel()
                return

    async def stop_process(self) -> None:
        """Shielded, bounded teardown: close stdin (the agent exits on EOF), then SIGTERM, then SIGKILL."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        with anyio.CancelScope(shield=True):
            if process.stdin is not None:
                with contextlib.suppress(Exception):
                    await process.stdin.aclose()
            with anyio.move_on_after(SHUTDOWN_GRACE):
                await process.wait()
                return
            process.terminate()
            with anyio.move_on_after(KILL_GRACE):
                await process.wait()
                return
            process.kill()
            await process.wait()
            # The runtime client died without stopping its container: remove it ourselves.
            if self.container_name:
                with anyio.move_on_after(REMOVE_TIMEOUT):
                    await anyio.run_process([self.argv[0], "rm", "-f", self.container_name], check=False)

    async def run(self) -> int:
        self.bind()
        # Handlers first: a SIGTERM that arrives once the container exists must stop it.
        watched = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP)
        with anyio.open_signal_receiver(*watched) as signals:
            log.info("starting the container: %s", " ".join(self.argv))
            async with await anyio.open_process(self.argv, stdin=-1, stdout=-1, stderr=-1) as process:
                self.process = process
                hello = {
                    "type": frames.HELLO,
                    "key": self.sandbox_key,
                    "session": self.session,
                    "agent_hash": self.agent_hash,
                }
                await self.send_frame(hello)
                ready = anyio.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.handle_signals, signals, tg.cancel_scope)
                    tg.start_soon(self.pump_stderr)
                    for channel in ROUTED_CHANNELS:
                        tg.start_soon(self.pump_socket, channel)
                    await self.pump_stdout(ready)  # returns at EOF: the container is ending
                    log.info("sandbox stdout closed")
                    await self.stop_process()
                    # stdout and stderr end independently: read the runtime's last words (why a
                    # start failed) before giving up on them.
                    with anyio.move_on_after(STDERR_GRACE):
                        await self.stderr_done.wait()
                    tg.cancel_scope.cancel()
        if self.dropped_frames:
            log.warning("dropped %d invalid frames from the sandbox in all", self.dropped_frames)
        status = process.returncode
        event = self.exit_event or {
            "event": "exit",
            "status": status,
            "reason": _runtime_failure(status, self.stderr_tail),
        }
        emit(event)
        return 0 if event.get("status") == 0 and ready.is_set() else 1


def _runtime_failure(status: int | None, stderr_tail: list[str]) -> str:
    detail = next((line for line in reversed(stderr_tail) if line.strip()), "")
    return f"the container exited with status {status}" + (f": {detail}" if detail else "")


def _heartbeat(address: str) -> None:
    """Echo heartbeats for as long as this process lives (like ipykernel's Heartbeat)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    with contextlib.suppress(zmq.ZMQError):
        zmq.proxy(sock, sock)


def emit(event: dict[str, Any]) -> None:
    """One JSON event line on stdout for the provisioner."""
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass


def _die_with_parent() -> None:
    """SIGTERM us when the process that started us dies, so a SIGKILLed bridge leaves no
    container running (PR_SET_PDEATHSIG; reap_orphans at the next start is the backstop)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def configure_logging(log_file: str | None) -> None:
    """Log to ``log_file`` (else stderr). The sandbox can make the kernel print without end, and
    each line becomes a log record: cap the file so a sandbox cannot fill the host's disk."""
    handler: logging.Handler = (
        logging.handlers.RotatingFileHandler(log_file, maxBytes=LOG_FILE_BYTES, backupCount=1)
        if log_file
        else logging.StreamHandler()
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kernelbridge.tunnel", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--connection-file", required=True)
    parser.add_argument("--session", default="sandbox")
    parser.add_argument("--agent-hash", default=None)
    parser.add_argument("--container-name", default=None, help="removed if the runtime client must be killed")
    parser.add_argument("--log-file", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- runtime argv of the container")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("the container command is missing (after --)")
    return args


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_file)
    connection = json.loads(Path(args.connection_file).read_text())
    tunnel = Tunnel(connection, args.command, args.agent_hash, args.session, args.container_name)
    try:
        return anyio.run(tunnel.run)
    except zmq.ZMQError as exc:
        emit({"event": "exit", "status": None, "reason": f"cannot bind the kernel ports: {exc}"})
        return 1
    except OSError as exc:
        emit({"event": "exit", "status": None, "reason": f"cannot start the container: {exc}"})
        return 1


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
