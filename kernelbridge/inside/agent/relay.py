"""The agent's poll loop: glue between the host link, the kernel and its rpc relay.

:meth:`Relay.run` accepts the host's hello, boots a kernel (it proves iopub delivers before
``ready``), then turns until the agent finishes: host frames are acted on, every source is polled
for what it wants now (nothing is read from the kernel while the link is backlogged), kernel
messages and output are forwarded, orphans reaped, a kernel's exit reported. A durable sandbox's
loop also admits a new host through the attach point (``adoption.py``) and answers the kernel's
host calls itself while none is attached. The loop's state is a :class:`Phase` (``state.py``);
which sources are polled is derived from the pieces each turn, not kept in flags.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import zmq

from kernelbridge import frames
from kernelbridge.inside.agent import files, init
from kernelbridge.inside.agent.adoption import AttachPoint, Candidate, Rejected, adopted_frame
from kernelbridge.inside.agent.hello import Refusal, baked_agent_hash
from kernelbridge.inside.agent.host_link import HostLink
from kernelbridge.inside.agent.kernel_client import (
    HOST_CHANNELS,
    KERNEL_READY_TIMEOUT,
    KernelClient,
    KernelNotReading,
    kernel_versions,
)
from kernelbridge.inside.agent.kernel_process import (
    KernelProcess,
    describe_exit,
    oom_killed,
    ports_taken,
    write_connection_file,
)
from kernelbridge.inside.agent.rpc_relay import RpcRelay, kernel_env
from kernelbridge.inside.agent.state import Phase, PhaseChange, next_phase

SHUTDOWN_REPLY_GRACE = 0.5
"""ipykernel sometimes lingers for seconds after answering shutdown_request, and the host waits
for the container to end: it gets this long, then it is stopped."""
POLL_MS = 200
"""Longest wait for a source; the chores of step 5 run at least this often."""
DRAIN_MESSAGES = 64
"""Kernel messages taken from one socket in one turn, at most: the host's stdin is read between."""
BOOT_ATTEMPTS = 3
"""Kernel starts tried when a port chosen for the kernel was taken before it bound it."""

IDLE_EXIT = 5
"""The agent's (and so the container's) exit status when it ended itself: no host for longer than
its idle timeout."""
DIED_DETACHED = 6
"""Exit status: the kernel died while no host was attached."""
OOM_DETACHED = 7
"""Exit status: the kernel ran out of memory while no host was attached."""
NO_HOST = (
    "no bridge is attached to this sandbox right now (it outlived its bridge); host MCP calls work"
    " again once a bridge adopts it"
)
HOST_WENT = "the bridge went away while this call was in flight (it may or may not have reached the server)"

Source = zmq.Socket[bytes] | int


@dataclass(slots=True)
class Kernel:
    """One kernel of the agent's life (a restart makes a new one): its pieces."""

    process: KernelProcess
    client: KernelClient
    rpc: RpcRelay
    rpc_fd: int
    """Kept: a closed socket's fileno() is -1, but the poller knows this number."""

    def sources(self) -> Iterator[Source]:
        yield from self.client.sockets
        yield self.process.output_fd
        yield self.rpc_fd


class PollSet:
    """A zmq.Poller whose registrations follow what each source wants now: :meth:`want` changes
    the poller only when a source's events change (0 unregisters it)."""

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._events: dict[Source, int] = {}

    def want(self, source: Source, events: int) -> None:
        if self._events.get(source, 0) == events:
            return
        if events:
            self._poller.register(source, events)
            self._events[source] = events
        else:
            self._poller.unregister(source)
            del self._events[source]

    def wanted(self, source: Source) -> int:
        return self._events.get(source, 0)

    def poll(self, timeout_ms: int) -> list[tuple[Any, int]]:
        return self._poller.poll(timeout_ms)


class Relay:
    """The agent: a host link, one kernel at a time, and the loop between them."""

    def __init__(self, link: HostLink) -> None:
        self.link = link
        self.phase = Phase.STARTING
        self.status = 0
        self._context = zmq.Context()
        self._identity = uuid.uuid4().hex
        """The kernel sockets' identity and the handshake's session, for the agent's life."""
        self._key = b""
        self._kernel: Kernel | None = None
        self._polls = PollSet()
        self._grace_ends = 0.0
        self._terminating = False  # set by the signal handler, acted on at the next turn
        self._reaper = init.Reaper()
        self._attach_point: AttachPoint | None = None
        self._candidate: Candidate | None = None
        self._departures = 0
        self._link_fds = (link.input_fd, link.output_fd)
        self._versions: dict[str, str] = {}

    def __repr__(self) -> str:
        kernel = self._kernel.process if self._kernel is not None else None
        return f"<Relay {self.phase.value}, {kernel!r}, {self.link!r}>"

    def _change(self, change: PhaseChange) -> None:
        """The one place the phase changes. Raises IllegalTransition (a bug) for a forbidden pair."""
        self.phase = next_phase(self.phase, change)

    def request_termination(self) -> None:
        """SIGTERM/SIGHUP (from the signal handler): stop the kernel and leave at the next turn."""
        self._terminating = True

    def run(self) -> int:
        """Accept the host, boot a kernel and relay until the end. Returns the exit status."""
        answer = self.link.accept_hello()
        if isinstance(answer, Refusal):
            return self._fail(answer.reason, answer.status, answer.kind)
        self._key = answer.key
        if answer.durable is not None:
            try:  # before the kernel exists: no kernel code can hold the name first
                self._attach_point = AttachPoint()
            except OSError as exc:
                return self._fail(f"cannot open the attach point: {exc}", 2, frames.EXIT_START_FAILED)
        failure = self._boot()
        if failure is not None:
            return self._fail(failure, 4, frames.EXIT_KERNEL_DIED)
        try:
            with self.link.polled():
                while self.phase is not Phase.FINISHED:
                    self._turn()
            return self.status
        finally:
            self.stop_kernel()
            if self._candidate is not None:
                self._candidate.handover.close()
            if self._attach_point is not None:
                self._attach_point.close()

    def stop_kernel(self) -> None:
        if self._kernel is not None:
            self._kernel.process.stop()

    # -- one turn ------------------------------------------------------------------------------
    def _turn(self) -> None:
        if self._terminating:
            self.stop_kernel()
            self.link.send_exit(0, frames.EXIT_SHUTDOWN, "stopped by SIGTERM")
            self._finish(0)
            return
        self._handle_host_frames()  # frames queued behind the hello come first
        if self.phase is Phase.FINISHED:
            return
        kernel = self._current()  # after a restart: the new one
        self.link.check(time.monotonic())
        if self.link.departures != self._departures:  # a durable host went: nobody answers its calls
            self._departures = self.link.departures
            kernel.rpc.fail_waiting(HOST_WENT)
        if self._candidate is not None and self._candidate.expired(time.monotonic()):
            self._drop_candidate().refuse("no hello within the time allowed")
        self._update_polls(kernel)
        for source, events in self._polls.poll(POLL_MS):
            self._move(kernel, source, events)
        self.link.flush()  # what this turn queued, in one write
        if self.phase is Phase.SHUTTING_DOWN and time.monotonic() > self._grace_ends:
            self.stop_kernel()
        self._reaper.reap(keep=(kernel.process.pid,))
        if kernel.process.poll() is not None:
            self._forward_kernel_output(kernel)
            self._report_kernel_exit(kernel)

    def _handle_host_frames(self) -> None:
        while (frame := self.link.receive()) is not None:
            self._on_host_frame(frame)
            if self.phase is Phase.FINISHED:
                return
        if self.link.ended:  # the link's verdict (host_link._host_left): no host will come again
            self.stop_kernel()
            self._finish(IDLE_EXIT if self.link.detached_at is not None else 0)

    def _on_host_frame(self, frame: frames.Frame) -> None:
        kind = frame["type"]
        kernel = self._current()
        if kind == frames.KERNEL:
            if frame["channel"] not in HOST_CHANNELS:
                self.link.log(f"dropped a kernel frame for the {frame['channel']} channel", "warning")
                return
            try:
                kernel.client.send(frame["channel"], frame["msg"], frames.frame_buffers(frame))
            except (ValueError, KeyError, TypeError, KernelNotReading) as exc:
                self.link.log(f"dropped kernel frame: {exc}", "warning")
        elif kind == frames.INTERRUPT:
            kernel.process.interrupt()
        elif kind == frames.RPC_RESPONSE:
            kernel.rpc.deliver(frame)
        elif kind == frames.FS_REQUEST:
            self.link.send(files.respond(workdir(), frame))
        elif kind == frames.RESTART:
            self._restart()
        elif kind == frames.SHUTDOWN:
            self.stop_kernel()
            self.link.send_exit(0, frames.EXIT_SHUTDOWN, "shutdown requested")
            self._finish(0)
        else:
            self.link.log(f"ignored {kind} frame", "debug")

    def _update_polls(self, kernel: Kernel) -> None:
        # The host has a backlog: stop taking the kernel's output until it drains (stdin is still
        # read, so the host never waits on us).
        reading = 0 if self.link.backlogged else zmq.POLLIN
        for sock in kernel.client.sockets:
            self._polls.want(sock, reading)
        link_fds = (self.link.input_fd, self.link.output_fd)
        if link_fds != self._link_fds:  # another host's pipes (or none): forget the old ones
            for fd in self._link_fds:
                if fd >= 0:
                    self._polls.want(fd, 0)
            self._link_fds = link_fds
        if self.link.input_fd >= 0:
            self._polls.want(self.link.input_fd, zmq.POLLIN if self.link.wants_read else 0)
        self._polls.want(kernel.process.output_fd, reading)
        if self.link.output_fd >= 0:
            self._polls.want(self.link.output_fd, zmq.POLLOUT if self.link.wants_write else 0)
        if self._attach_point is not None:
            self._polls.want(self._attach_point.fileno(), zmq.POLLIN)
        if self._candidate is not None:
            self._polls.want(self._candidate.input_fd, zmq.POLLIN)
        rpc = kernel.rpc
        rpc_events = 0 if rpc.closed else reading | (zmq.POLLOUT if rpc.wants_write else 0)
        self._polls.want(kernel.rpc_fd, rpc_events)

    def _move(self, kernel: Kernel, source: Source, events: int) -> None:
        """Act on one ready source."""
        if source == self.link.input_fd:
            self.link.read()
        elif source == self.link.output_fd:
            self.link.flush()
        elif self._attach_point is not None and source == self._attach_point.fileno():
            self._on_handovers()
        elif self._candidate is not None and source == self._candidate.input_fd:
            self._on_candidate()
        elif source == kernel.process.output_fd:
            self._forward_kernel_output(kernel)
        elif source == kernel.rpc_fd and self._polls.wanted(kernel.rpc_fd):
            if events & zmq.POLLOUT:
                kernel.rpc.on_writable()
            if events & zmq.POLLIN:
                kernel.rpc.on_readable()
            if kernel.rpc.closed:
                self._polls.want(kernel.rpc_fd, 0)
        elif isinstance(source, zmq.Socket):
            self._relay_kernel_messages(kernel, source)

    def _relay_kernel_messages(self, kernel: Kernel, sock: zmq.Socket[bytes]) -> None:
        """What ``sock`` (readable) holds now, up to DRAIN_MESSAGES and while the host keeps up:
        a kernel sends a cell's messages in bursts (busy and its input, the result, idle and the
        reply), and a burst queued in one turn is written at once."""
        for _ in range(DRAIN_MESSAGES):
            received = kernel.client.receive(sock)
            if received is not None:
                channel, msg, buffers = received
                self.link.send(frames.kernel_frame(channel, msg, buffers))
                if msg["header"].get("msg_type") == "shutdown_reply" and self.phase is Phase.RELAYING:
                    self._change(PhaseChange.SHUTDOWN_REPLY)
                    self._grace_ends = time.monotonic() + SHUTDOWN_REPLY_GRACE
            if self.link.backlogged or not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                return

    # -- a new host (durable sandboxes) ------------------------------------------------------------
    def _on_handovers(self) -> None:
        assert self._attach_point is not None and self.link.durable is not None
        for handover in self._attach_point.accept():
            if self._candidate is not None and self._candidate.heard_from:
                Candidate(handover, self.link.durable.secret, None, 0).refuse(
                    "another bridge is being admitted right now"
                )
                continue
            if self._candidate is not None:
                # It has not said a byte since its challenge: a live bridge answers at once, so
                # this is most likely a dead one whose exec session the engine keeps open. Waiting
                # out its deadline would refuse (and lose the session for) every bridge after it.
                self._drop_candidate().refuse("another bridge came while this one was silent")
            self._candidate = Candidate(
                handover, self.link.durable.secret, baked_agent_hash(), time.monotonic()
            )

    def _drop_candidate(self) -> Candidate:
        """The current candidate, no longer polled (before its pipes may close)."""
        candidate, self._candidate = self._candidate, None
        assert candidate is not None
        self._polls.want(candidate.input_fd, 0)
        return candidate

    def _on_candidate(self) -> None:
        assert self._candidate is not None and self.link.durable is not None
        verdict = self._candidate.on_readable()
        if verdict is None:
            return
        candidate = self._drop_candidate()
        if isinstance(verdict, Rejected):
            self.link.log(f"refused a bridge that tried to attach: {verdict.reason}", "warning")
            candidate.refuse(verdict.reason)
            return
        if self.link.attached:
            heard = time.monotonic() - self.link.heard
            candidate.refuse(f"another bridge is attached to this sandbox (heard from {heard:.0f} s ago)")
            return
        facts = {**self.link.adoption_facts(), "versions": self._versions, "agent_hash": baked_agent_hash()}
        adopted = adopted_frame(self.link.durable.secret, candidate, verdict, facts)
        self.link.attach(candidate.handover, adopted)

    def _rpc_to_host(self, rpc: RpcRelay, frame: frames.Frame) -> None:
        """A kernel's host call: to the host, or, while none is attached, answered at once."""
        if self.link.attached:
            self.link.send(frame)
        else:
            rpc.answer_unavailable(frame["id"], NO_HOST)

    def _forward_kernel_output(self, kernel: Kernel) -> None:
        for line in kernel.process.read_output():
            self.link.log(line, "kernel")

    def _report_kernel_exit(self, kernel: Kernel) -> None:
        status = kernel.process.returncode
        kind = frames.EXIT_KERNEL_DIED
        if self.phase is Phase.SHUTTING_DOWN:  # it had answered a shutdown_request: a clean exit
            status, reason, kind = 0, "shut down on request", frames.EXIT_SHUTDOWN
        else:
            reason = describe_exit(status)
            if status == -signal.SIGKILL and oom_killed():
                kind = frames.EXIT_OOM
        self.link.send_exit(status, kind, reason)
        if self.link.attached or self.link.durable is None:
            self._finish(0)
        else:  # nobody will read that frame: the container's exit status says it to the next bridge
            self._finish(OOM_DETACHED if kind == frames.EXIT_OOM else DIED_DETACHED)

    # -- kernel (re)start ------------------------------------------------------------------------
    def _boot(self) -> str | None:
        """Start a kernel, prove iopub delivers and say ``ready``; else the reason it failed. The
        ports are chosen free and bound by the kernel later: if another process took one meanwhile
        (the local test double's agents share the host's ports; in a container only the session's
        own processes could), the start is tried again on others, up to BOOT_ATTEMPTS times."""
        attempt = 1
        while True:
            connection = write_connection_file(self._key)
            failure = self._boot_on(connection)
            if failure is None or attempt == BOOT_ATTEMPTS or not ports_taken(connection):
                return failure
            self._drop(self._current())
            self.link.log(f"kernel start: one of its ports was taken meanwhile ({failure}); again", "warning")
            attempt += 1

    def _boot_on(self, connection: dict[str, Any]) -> str | None:
        rpc = RpcRelay(lambda frame: self._rpc_to_host(rpc, frame), self.link.log)
        process = KernelProcess.start(
            connection["path"], cwd=workdir(), env=kernel_env(rpc), pass_fds=(rpc.kernel_fd,)
        )
        rpc.kernel_started()
        client = KernelClient(self._context, connection, self._key, self._identity, self.link.log)
        self._kernel = kernel = Kernel(process, client, rpc, rpc.fd)
        kernel_info = client.wait_until_iopub_delivers(alive=lambda: process.poll() is None)
        if kernel_info is None:
            self._forward_kernel_output(kernel)
            status = process.poll()
            process.stop()
            if status is None:
                return f"kernel did not answer within {KERNEL_READY_TIMEOUT:g} s"
            return f"kernel exited during start-up: {describe_exit(status)}"
        self._versions = kernel_versions(kernel_info)
        self.link.send({"type": frames.READY, "agent_hash": baked_agent_hash(), "versions": self._versions})
        self._change(PhaseChange.BOOTED)
        return None

    def _restart(self) -> None:
        """A new kernel in the same container: variables go, /workspace and /tmp stay. The old
        kernel's whole process group is killed at once (it may be stuck, that is why the host
        restarts it); calls of the old kernel die with its rpc socket."""
        self._drop(self._current())
        self._change(PhaseChange.RESTART)
        failure = self._boot()
        if failure is not None:
            self._fail(failure, 4, frames.EXIT_KERNEL_DIED)

    # -- helpers -----------------------------------------------------------------------------------
    def _drop(self, old: Kernel) -> None:
        """End ``old`` and everything of it: its whole process group at once, its pipes, sockets."""
        for source in old.sources():
            self._polls.want(source, 0)  # before closing: the poller must not hold closed sources
        old.process.kill_group()
        old.process.close()
        old.rpc.close()
        old.client.close()

    def _current(self) -> Kernel:
        assert self._kernel is not None, "no kernel before the boot"
        return self._kernel

    def _fail(self, reason: str, status: int, kind: str) -> int:
        self.link.send_exit(status, kind, reason)
        self._finish(status)
        return status

    def _finish(self, status: int) -> None:
        self._change(PhaseChange.FINISH)
        self.status = status


def workdir() -> str:
    """The kernel's working directory and the root of file requests (/workspace in the image)."""
    return os.environ.get("KERNELBRIDGE_WORKDIR") or os.getcwd()
