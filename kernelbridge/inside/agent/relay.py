"""The sandbox agent: runs INSIDE the container as its main process.

It owns the container end of the tunnel:

1. reads the ``hello`` frame from stdin (the kernel HMAC key travels here, never in argv/env),
   and refuses to run if the host expects a different agent (stale image);
2. starts ipykernel bound to 127.0.0.1 of the container's own network namespace, with stdin,
   stdout and stderr of its own: only the agent speaks frames on the container's stdio;
3. proves that iopub delivers (kernel_info_request until its iopub status arrives) before it
   sends ``ready``; otherwise the first cell's outputs could be lost to ZMQ's slow joiner;
4. relays every kernel message as a ``kernel`` frame, and host frames to the kernel, until the
   kernel exits (``exit`` frame with its status) or the host says ``shutdown`` / closes stdin;
5. relays the kernel's host MCP calls (``rpc_relay.py``) and serves the host's file requests on
   /workspace (``files.py``).

It runs as the container's PID 1 (``init.py``: no init process may hold the frame pipes where
kernel code can reach them), non-dumpable, and reaps orphaned processes.

Depends on the standard library, pyzmq and ``kernelbridge.frames`` only. Messages are signed
with the kernel's key but not verified: the agent and the kernel share one trust domain (the
user's code could read the key anyway); the host verifies nothing from here either, it treats
every frame as untrusted data.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import zmq

from kernelbridge import frames
from kernelbridge.inside.agent import files, init
from kernelbridge.inside.agent.outbox import Outbox
from kernelbridge.inside.agent.rpc_relay import RpcRelay, kernel_env

AGENT_HASH_FILE = Path(__file__).parents[1] / "AGENT_HASH"
HELLO_TIMEOUT = 30.0
# Why 60 s: ipykernel 7 is ready in ~0.25 s, but 20 kernels started at once on 2 cores take
# ~12 s; a kernel that needs longer than this is broken, not slow.
KERNEL_READY_TIMEOUT = 60.0
# Re-ask every 0.05 s: an iopub SUB that joins late misses the status of the first requests, and
# each retry interval is paid in full by every cold start. kernel_info is cheap to answer.
KERNEL_INFO_RETRY = 0.05
SHUTDOWN_GRACE = 2.0
SHUTDOWN_REPLY_GRACE = 0.5
MAX_LOG_LINE = 2000
# Why 200 lines per 10 s: the kernel's own fd 1/2 (C extensions, os.write) becomes log frames, and
# kernel code can write there without end; the host must not turn that into a log flood.
LOG_BURST = 200
LOG_WINDOW = 10.0
REAP_EVERY = 1.0
PYTHONPATH_DIR = Path(__file__).parents[1] / "pythonpath"
"""Put on the kernel's PYTHONPATH: the ``mcp`` package that sandbox code imports."""
KERNEL_EXTENSIONS = ("kernelbridge.inside.kernel.bounded_history", "mcp._ipython")
OUTPUT_DRAIN_TIMEOUT = 10.0
"""Bound on waiting for the host to read a frame outside the relay loop (start-up, exit)."""
RESTARTED = -1
"""handle_host_frames' answer after a restart frame replaced the kernel (not an exit status)."""
CHANNEL_OF_PORT = {"shell": "shell_port", "control": "control_port", "stdin": "stdin_port"}


class Agent:
    def __init__(self, out_fd: int | None = None) -> None:
        self.outbox = Outbox(sys.stdout.fileno() if out_fd is None else out_fd)
        self._relaying = False
        self._stdin = sys.stdin.fileno()
        self._decoder = frames.FrameDecoder()
        self._incoming: collections.deque[frames.Frame] = collections.deque()
        self._stdin_closed = False
        self._kill_at: float | None = None  # set once the kernel answered a shutdown_request
        self.ctx = zmq.Context()
        self.kernel: subprocess.Popen[bytes] | None = None
        self.sockets: dict[str, zmq.Socket[bytes]] = {}
        self.key = b""
        self.session_id = uuid.uuid4().hex
        self.rpc: RpcRelay | None = None
        self.terminating = False
        self._log_window_start = time.monotonic()
        self._log_count = 0
        self._log_suppressed = 0
        self._next_reap = 0.0

    # -- output ---------------------------------------------------------------------------
    def send(self, frame: frames.Frame) -> None:
        """Queue a frame for the host. Outside the relay loop (start-up, a failed start) wait
        until it is written; inside, the loop writes it as stdout takes it (see outbox.py)."""
        data = frames.encode(frame)
        if len(data) > frames.MAX_FRAME_BYTES and frame["type"] == frames.KERNEL:
            # The host drops a frame over its cap, and a dropped reply leaves a cell hanging until
            # its timeout (e.g. an exception whose message is a 30 MiB repr): send it clipped.
            shrunk = frames.encode(shrink_kernel_frame(frame))
            if len(shrunk) > frames.MAX_FRAME_BYTES:
                self.log(f"dropped a kernel message of {len(data):,} bytes: over the frame cap", "warning")
                return
            data = shrunk
        self.outbox.put(data)
        if not self._relaying:
            self.outbox.drain(OUTPUT_DRAIN_TIMEOUT)

    def log(self, message: str, level: str = "info") -> None:
        """A log frame for the host, rate-limited: past LOG_BURST lines in a window the rest are
        counted and reported once when the window ends."""
        now = time.monotonic()
        if now - self._log_window_start > LOG_WINDOW:
            if self._log_suppressed:
                suppressed, self._log_suppressed = self._log_suppressed, 0
                self.send(
                    {"type": frames.LOG, "level": "warning", "message": f"{suppressed} log lines suppressed"}
                )
            self._log_window_start, self._log_count = now, 0
        self._log_count += 1
        if self._log_count > LOG_BURST:
            self._log_suppressed += 1
            return
        self.send({"type": frames.LOG, "level": level, "message": message[:MAX_LOG_LINE]})

    def send_exit(self, status: int | None, kind: str, reason: str) -> None:
        self.send({"type": frames.EXIT, "status": status, "kind": kind, "reason": reason})

    def fail(self, reason: str, status: int = 1, kind: str = frames.EXIT_START_FAILED) -> int:
        self.send_exit(status, kind, reason)
        return status

    @property
    def workdir(self) -> str:
        return os.environ.get("KERNELBRIDGE_WORKDIR") or os.getcwd()

    def request_termination(self) -> None:
        """SIGTERM/SIGHUP (from the signal handler): stop the kernel and leave at the next turn."""
        self.terminating = True

    # -- start-up ------------------------------------------------------------------------
    def read_hello(self) -> frames.Frame | None:
        """The first frame on stdin, which must be ``hello``. Later frames stay queued."""
        deadline = time.monotonic() + HELLO_TIMEOUT
        while not self._incoming and not self._stdin_closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._stdin], [], [], remaining)[0]:
                return None
            self.read_stdin()
        frame = self._incoming.popleft() if self._incoming else None
        return frame if frame is not None and frame["type"] == frames.HELLO else None

    def check_agent_hash(self, expected: str | None) -> str | None:
        """Return None if this agent is the one the host expects, else the reason why not."""
        baked = baked_agent_hash() or "unknown"
        if expected and expected != baked:
            return (
                f"the sandbox image carries agent {baked[:12]} but this kernelbridge "
                f"expects {expected[:12]}; rebuild it with `kernelbridge image build`"
            )
        return None

    def write_connection_file(self) -> dict[str, Any]:
        ports = _free_ports(5)
        info = {
            "transport": "tcp",
            "ip": "127.0.0.1",
            "shell_port": ports[0],
            "iopub_port": ports[1],
            "stdin_port": ports[2],
            "control_port": ports[3],
            "hb_port": ports[4],
            "key": self.key.decode(),
            "signature_scheme": "hmac-sha256",
            "kernel_name": "python3",
        }
        runtime_dir = Path(os.environ.get("JUPYTER_RUNTIME_DIR", "/tmp/.kernelbridge"))
        runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = runtime_dir / "kernel.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        info["path"] = str(path)
        return info

    def start_kernel(self, info: dict[str, Any]) -> None:
        argv = [
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            info["path"],
            # Input history answers history_request (%history, a console's up-arrow) from an
            # in-memory database without outputs; bounded_history bounds what it keeps.
            "--HistoryManager.hist_file=:memory:",
            "--HistoryManager.db_log_output=False",
            # history_reply with real session numbers: see kernelbridge/inside/kernel/kernel_class.py.
            "--IPKernelApp.kernel_class=kernelbridge.inside.kernel.kernel_class.SandboxKernel",
            # Bounded output messages and a per-cell cap: see kernelbridge/inside/kernel/capped_outstream.py.
            "--IPKernelApp.outstream_class=kernelbridge.inside.kernel.capped_outstream.CappedOutStream",
            # bounded_history stops IPython 9 from keeping every printed byte for the kernel's
            # lifetime; mcp._ipython binds the host-MCP sandbox API (`runtime`, `mcp_servers`...).
            f"--IPKernelApp.extensions={json.dumps(list(KERNEL_EXTENSIONS))}",
        ]
        self.rpc = RpcRelay(self.send, self.log)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHONPATH_DIR), env.get("PYTHONPATH")]))
        env.update(kernel_env(self.rpc))
        self.kernel = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
            pass_fds=(self.rpc.kernel_fd,),
            # The agent ignores SIGINT, and an ignored signal stays ignored across exec: give the
            # kernel the default disposition back so that interrupts reach it; and the kernel
            # never outlives the agent.
            preexec_fn=_prepare_kernel_process,
            # Its own process group: ipykernel interrupts by signalling its whole group, which
            # must reach the user's subprocesses but not the agent.
            start_new_session=True,
        )
        self.rpc.kernel_started()
        for channel, port_key in CHANNEL_OF_PORT.items():
            sock = self.ctx.socket(zmq.DEALER)
            # ipykernel sends input_request to the identity that sent the execute_request on
            # shell, through its stdin ROUTER: both sockets must share one identity.
            sock.setsockopt(zmq.IDENTITY, self.session_id.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{info[port_key]}")
            self.sockets[channel] = sock
        iopub = self.ctx.socket(zmq.SUB)
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        iopub.setsockopt(zmq.LINGER, 0)
        iopub.connect(f"tcp://127.0.0.1:{info['iopub_port']}")
        self.sockets["iopub"] = iopub

    def wait_until_iopub_delivers(self) -> dict[str, Any] | None:
        """Send kernel_info_request until both its reply and an iopub message answering one of
        them arrive. Returns the kernel_info reply content, or None if the kernel died/hung."""
        shell, iopub = self.sockets["shell"], self.sockets["iopub"]
        poller = zmq.Poller()
        poller.register(shell, zmq.POLLIN)
        poller.register(iopub, zmq.POLLIN)
        sent: set[str] = set()
        reply: dict[str, Any] | None = None
        iopub_seen = False
        deadline = time.monotonic() + KERNEL_READY_TIMEOUT
        next_send = 0.0
        while time.monotonic() < deadline:
            if self.kernel is not None and self.kernel.poll() is not None:
                return None
            if time.monotonic() >= next_send and not iopub_seen:
                sent.add(self.send_to_kernel("shell", _new_message("kernel_info_request", self.session_id)))
                next_send = time.monotonic() + KERNEL_INFO_RETRY
            for sock, _ in poller.poll(50):
                received = self.receive_from_kernel(sock)
                if received is None:
                    continue
                msg = received[0]
                parent = msg.get("parent_header", {}).get("msg_id")
                if parent not in sent:
                    continue
                if sock is iopub:
                    iopub_seen = True
                elif msg["header"].get("msg_type") == "kernel_info_reply":
                    reply = msg["content"]
            if iopub_seen and reply is not None:
                self.drain(poller)
                return reply
        return None

    def drain(self, poller: zmq.Poller) -> None:
        """Discard the remaining answers to the handshake so they do not reach the host."""
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            for sock, _ in poller.poll(10):
                self.receive_from_kernel(sock)

    # -- relay ------------------------------------------------------------------------------
    def send_to_kernel(self, channel: str, msg: dict[str, Any], buffers: list[bytes] | None = None) -> str:
        self.sockets[channel].send_multipart(frames.to_wire(msg, buffers or [], self.key), copy=False)
        return msg["header"].get("msg_id", "")

    def receive_from_kernel(self, sock: zmq.Socket[bytes]) -> tuple[dict[str, Any], list[bytes]] | None:
        """The next message of ``sock``, or None (logged) if it is malformed."""
        try:
            wire = frames.from_wire(sock.recv_multipart())
        except ValueError as exc:
            self.log(f"dropped a malformed kernel message: {exc}", "warning")
            return None
        return wire.msg, wire.buffers

    def read_stdin(self) -> None:
        """Decode whatever stdin has into the incoming queue. We read the fd directly (no
        buffered reader, no thread): the zmq poller watches it next to the kernel's sockets."""
        try:
            chunk = os.read(self._stdin, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self._stdin_closed = True
            return
        for item in self._decoder.feed(chunk):
            if isinstance(item, frames.FrameError):
                self.log(f"dropped host frame: {item.reason}", "warning")
            else:
                self._incoming.append(item)

    def relay(self) -> int:
        """Relay until the kernel exits or the host leaves. Returns the agent's exit status."""
        os.set_blocking(self._stdin, False)
        while True:  # once per kernel: a restart replaces the kernel and its sockets
            self._relaying = True
            try:
                status = self.relay_kernel()
            finally:
                self._relaying = False
            if status is not None:
                return status

    def relay_kernel(self) -> int | None:
        """Relay for the current kernel; None when it was replaced by a restart."""
        poller = zmq.Poller()
        channel_of = {}
        for channel, sock in self.sockets.items():
            poller.register(sock, zmq.POLLIN)
            channel_of[sock] = channel
        poller.register(self._stdin, zmq.POLLIN)
        assert self.kernel is not None and self.kernel.stdout is not None and self.rpc is not None
        kernel_out = self.kernel.stdout.fileno()
        os.set_blocking(kernel_out, False)
        poller.register(kernel_out, zmq.POLLIN)
        rpc = self.rpc
        rpc_fd = rpc.fd  # kept: a closed socket's fileno() is -1, but the poller knows this number
        rpc_events = 0
        out_fd = self.outbox.fd
        writing = paused = False
        while True:
            if self.terminating:
                self.stop_kernel()
                self.send_exit(0, frames.EXIT_SHUTDOWN, "stopped by SIGTERM")
                return 0
            status = self.handle_host_frames()  # frames queued behind the hello come first
            if status is not None:
                return None if status == RESTARTED else status
            # The host has a backlog: stop taking the kernel's output until it drains (stdin is
            # still read, so the host never waits on us).
            if self.outbox.full != paused:
                paused = self.outbox.full
                for source in (*channel_of, kernel_out):
                    poller.modify(source, 0 if paused else zmq.POLLIN)
            if bool(self.outbox.pending) != writing:
                writing = bool(self.outbox.pending)
                if writing:
                    poller.register(out_fd, zmq.POLLOUT)
                else:
                    poller.unregister(out_fd)
            reading = 0 if paused else zmq.POLLIN
            wanted = 0 if rpc.closed else reading | (zmq.POLLOUT if rpc.wants_write else 0)
            if wanted != rpc_events:
                if rpc_events:
                    poller.unregister(rpc_fd)
                if wanted:
                    poller.register(rpc_fd, wanted)
                rpc_events = wanted
            for sock, event in poller.poll(200):
                if sock == self._stdin:
                    self.read_stdin()
                elif sock == out_fd:
                    self.outbox.flush()
                elif sock == kernel_out:
                    self.forward_kernel_output(kernel_out)
                elif rpc_events and sock == rpc_fd:
                    if event & zmq.POLLOUT:
                        rpc.on_writable()
                    if event & zmq.POLLIN:
                        rpc.on_readable()
                    if rpc.closed:
                        poller.unregister(rpc_fd)
                        rpc_events = 0
                elif (received := self.receive_from_kernel(sock)) is not None:
                    msg, buffers = received
                    self.send(frames.kernel_frame(channel_of[sock], msg, buffers))
                    self.note_shutdown_reply(msg)
            if self._kill_at is not None and time.monotonic() > self._kill_at:
                self.stop_kernel()
            self.reap()
            if self.kernel.poll() is not None:
                self.forward_kernel_output(kernel_out)
                return self.report_kernel_exit()

    def reap(self) -> None:
        """As PID 1, wait for orphaned processes (never the kernel: its Popen does that)."""
        now = time.monotonic()
        if now < self._next_reap or not init.is_init():
            return
        self._next_reap = now + REAP_EVERY
        keep = {self.kernel.pid} if self.kernel is not None else set()
        init.reap_orphans(keep)

    def note_shutdown_reply(self, msg: dict[str, Any]) -> None:
        """ipykernel sometimes lingers for seconds after answering shutdown_request; the host
        waits for the container to end, so give the kernel a short grace, then stop it."""
        if msg["header"].get("msg_type") == "shutdown_reply" and self._kill_at is None:
            self._kill_at = time.monotonic() + SHUTDOWN_REPLY_GRACE

    def handle_host_frames(self) -> int | None:
        """Act on queued host frames. Returns an exit status, RESTARTED, or None to go on."""
        while True:
            if not self._incoming:
                if self._stdin_closed:  # the host is gone: stop everything
                    self.stop_kernel()
                    return 0
                return None
            frame = self._incoming.popleft()
            kind = frame["type"]
            if kind == frames.KERNEL and frame["channel"] not in CHANNEL_OF_PORT:
                self.log(f"dropped a kernel frame for the {frame['channel']} channel", "warning")
            elif kind == frames.KERNEL:
                try:
                    self.send_to_kernel(frame["channel"], frame["msg"], frames.frame_buffers(frame))
                except (ValueError, KeyError, TypeError) as exc:
                    self.log(f"dropped kernel frame: {exc}", "warning")
            elif kind == frames.INTERRUPT and self.kernel is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.kernel.pid, signal.SIGINT)
            elif kind == frames.RPC_RESPONSE and self.rpc is not None:
                self.rpc.deliver(frame)
            elif kind == frames.FS_REQUEST:
                self.serve_file_request(frame)
            elif kind == frames.RESTART:
                return self.restart_kernel()
            elif kind == frames.SHUTDOWN:
                self.stop_kernel()
                self.send_exit(0, frames.EXIT_SHUTDOWN, "shutdown requested")
                return 0
            else:
                self.log(f"ignored {kind} frame", "debug")

    def serve_file_request(self, frame: frames.Frame) -> None:
        answer: frames.Frame = {"type": frames.FS_RESPONSE, "id": frame.get("id")}
        try:
            answer["result"] = files.handle(self.workdir, frame.get("op"), frame)
        except files.FsError as exc:
            answer["error"] = {"kind": exc.kind, "message": exc.message}
        except Exception as exc:  # an agent bug must not end the relay
            answer["error"] = {"kind": "io_error", "message": f"{type(exc).__name__}: {exc}"[:500]}
        self.send(answer)

    def forward_kernel_output(self, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        for line in data.decode(errors="replace").splitlines():
            if line.strip():
                self.log(line, "kernel")

    def report_kernel_exit(self) -> int:
        assert self.kernel is not None
        status = self.kernel.returncode
        kind = frames.EXIT_KERNEL_DIED
        if self._kill_at is not None:  # it had answered a shutdown_request: a clean exit
            status, reason, kind = 0, "shut down on request", frames.EXIT_SHUTDOWN
        else:
            reason = describe_exit(status)
            if status == -signal.SIGKILL and _oom_killed():
                kind = frames.EXIT_OOM
        self.send_exit(status, kind, reason)
        return 0

    def stop_kernel(self) -> None:
        if self.kernel is None or self.kernel.poll() is not None:
            return
        self.kernel.terminate()
        try:
            self.kernel.wait(SHUTDOWN_GRACE)
        except subprocess.TimeoutExpired:
            self.kernel.kill()
            self.kernel.wait()

    # -- kernel (re)start ---------------------------------------------------------------------
    def restart_kernel(self) -> int:
        """A new kernel in the same container: variables go, /workspace and /tmp stay. The
        old kernel's whole process group is killed at once (it may be stuck, that is why the
        host restarts it). Returns RESTARTED, or an exit status if no new kernel came up."""
        if self.kernel is not None:
            if self.kernel.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.kernel.pid, signal.SIGKILL)
                self.kernel.wait()
            if self.kernel.stdout is not None:
                self.kernel.stdout.close()  # one pipe per kernel: don't leak it across restarts
        if self.rpc is not None:
            self.rpc.close()  # calls of the old kernel die with it; the new one gets a new socket
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.sockets.clear()
        self._kill_at = None
        failure = self.boot_kernel()
        return RESTARTED if failure is None else self.fail(failure, 4, frames.EXIT_KERNEL_DIED)

    def boot_kernel(self) -> str | None:
        """Start a kernel, prove iopub delivers and say ``ready``; else the reason it failed."""
        self.start_kernel(self.write_connection_file())
        kernel_info = self.wait_until_iopub_delivers()
        if kernel_info is None:
            assert self.kernel is not None
            if self.kernel.stdout is not None:
                self.forward_kernel_output(self.kernel.stdout.fileno())
            status = self.kernel.poll()
            self.stop_kernel()
            if status is None:
                return "kernel did not answer within 60 s"
            return f"kernel exited during start-up: {describe_exit(status)}"
        self.send(
            {
                "type": frames.READY,
                "agent_hash": baked_agent_hash(),
                "versions": {
                    "python": sys.version.split()[0],
                    "ipykernel": _package_version("ipykernel"),
                    "ipython": kernel_info.get("implementation_version"),
                    "protocol": kernel_info.get("protocol_version"),
                },
            }
        )
        return None

    # -- main -------------------------------------------------------------------------------
    def run(self) -> int:
        hello = self.read_hello()
        if hello is None:
            return self.fail("no valid hello frame on stdin within 30 s", 2)
        mismatch = self.check_agent_hash(hello.get("agent_hash"))
        if mismatch:
            return self.fail(mismatch, 3, frames.EXIT_AGENT_MISMATCH)
        self.key = str(hello.get("key", "")).encode()
        failure = self.boot_kernel()
        if failure is not None:
            return self.fail(failure, 4, frames.EXIT_KERNEL_DIED)
        try:
            return self.relay()
        finally:
            self.stop_kernel()


CLIP_STRING = 1024 * 1024
"""Strings of a kernel message longer than this are cut when the message is over the frame cap."""


def shrink_kernel_frame(frame: frames.Frame) -> frames.Frame:
    """``frame`` with every string of its message cut to CLIP_STRING and its buffers dropped."""
    return frames.kernel_frame(frame["channel"], _clipped(frame["msg"], 0))


def _clipped(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        if len(value) <= CLIP_STRING:
            return value
        return value[:CLIP_STRING] + f"... [{len(value) - CLIP_STRING:,} characters cut by kernelbridge]"
    if depth > frames.MAX_DEPTH:
        return None
    if isinstance(value, dict):
        return {key: _clipped(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_clipped(item, depth + 1) for item in value]
    return value


def baked_agent_hash() -> str | None:
    """The agent hash the image builder wrote next to this file (None outside an image)."""
    return AGENT_HASH_FILE.read_text().strip() if AGENT_HASH_FILE.exists() else None


def describe_exit(status: int | None) -> str:
    if status is None:
        return "still running"
    if status >= 0:
        return f"exited with status {status}"
    name = signal.Signals(-status).name if -status in signal.valid_signals() else str(-status)
    reason = f"killed by {name}"
    if status == -signal.SIGKILL and _oom_killed():
        reason += " (out of memory: the sandbox's memory limit was reached)"
    return reason


def _oom_killed() -> bool:
    """Whether the container's cgroup recorded an OOM kill (cgroup v2 or v1)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
    return False


def _new_message(msg_type: str, session: str) -> dict[str, Any]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": "kernelbridge",
        "session": session,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        "version": "5.3",
    }
    return {"header": header, "parent_header": {}, "metadata": {}, "content": {}}


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _prepare_kernel_process() -> None:
    """preexec_fn of the kernel: default SIGINT (the agent ignores it), die with the agent, and be
    the out-of-memory killer's first choice: when the sandbox's memory runs out, the kernel dies
    and the agent lives to report it (``exit`` kind ``oom``). If the agent were chosen (it may
    hold the kernel's queued output), the host would see the container end with status 137 and
    no reason."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    init.die_with_parent()
    init.prefer_for_oom_kill()


def main() -> None:
    init.make_undumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the kernel, not for us
    agent = Agent()
    init.on_terminate(agent.request_termination)
    try:
        status = agent.run()
    except BrokenPipeError:
        agent.stop_kernel()
        status = 0
    # Whatever is still queued (the exit frame) goes out, bounded: the host may be gone.
    with contextlib.suppress(OSError):
        agent.outbox.drain(OUTPUT_DRAIN_TIMEOUT)
    # os._exit, not sys.exit: nothing must run after this (the interpreter's shutdown could
    # stall), and the container ends with us.
    os._exit(status)


if __name__ == "__main__":
    main()
