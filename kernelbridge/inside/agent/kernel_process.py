"""The kernel process: the agent's ipykernel subprocess, started, signalled, stopped and described.

:meth:`KernelProcess.start` runs ipykernel with kernelbridge's kernel pieces loaded
(:func:`kernel_argv`), the rpc socket as its only inherited fd, stdin from /dev/null and one pipe for
its output, in its own process group, dying with the agent and the out-of-memory killer's first
choice. :meth:`KernelProcess.stop`: SIGTERM, up to :data:`SHUTDOWN_GRACE`, then SIGKILL and wait; only
the kernel process is signalled. :meth:`KernelProcess.kill_group` (a restart): SIGKILL to its whole
group at once. Standard library only (and ``init.py``'s prctl helpers). Why: docs/design/sandbox.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbridge.inside.agent import init

SHUTDOWN_GRACE = 2.0
"""SIGTERM -> SIGKILL. A kernel still running 2 s after SIGTERM is stuck, not slow; the host gives
the whole ``shutdown`` about as long before it removes the container anyway."""
PYTHONPATH_DIR = Path(__file__).parents[1] / "pythonpath"
"""Put on the kernel's PYTHONPATH: the ``mcp`` package that sandbox code imports."""
KERNEL_CLASS = "kernelbridge.inside.kernel.kernel_class.SandboxKernel"
OUTSTREAM_CLASS = "kernelbridge.inside.kernel.capped_outstream.CappedOutStream"
KERNEL_EXTENSIONS = (
    "kernelbridge.inside.kernel.bounded_history",
    "mcp._ipython",
    "kernelbridge.inside.kernel.pip_magic",
)
KERNEL_FLAGS = (
    # Input history answers history_request (%history, a console's up-arrow) from an in-memory
    # database without outputs; bounded_history bounds what it keeps.
    "--HistoryManager.hist_file=:memory:",
    "--HistoryManager.db_log_output=False",
    # history_reply with real session numbers: see kernelbridge/inside/kernel/kernel_class.py.
    f"--IPKernelApp.kernel_class={KERNEL_CLASS}",
    # Bounded output messages and a per-cell cap: see kernelbridge/inside/kernel/capped_outstream.py.
    f"--IPKernelApp.outstream_class={OUTSTREAM_CLASS}",
    # bounded_history stops IPython 9 from keeping every printed byte for the kernel's lifetime;
    # mcp._ipython binds the host-MCP sandbox API (`runtime`, `mcp_servers`...); pip_magic puts
    # the session's packages on sys.path and makes `%pip install` go through the host.
    f"--IPKernelApp.extensions={json.dumps(list(KERNEL_EXTENSIONS))}",
)
"""What the agent passes after ``-f <connection file>``; tests start local kernels with the same."""
OUTPUT_CHUNK = 65536
CONNECTION_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def kernel_argv(connection_file: str, python: Sequence[str] = (sys.executable,)) -> list[str]:
    """The kernel's command line: ``python`` (the interpreter and its options) runs ipykernel."""
    return [*python, "-m", "ipykernel_launcher", "-f", connection_file, *KERNEL_FLAGS]


def write_connection_file(key: bytes) -> dict[str, Any]:
    """A fresh connection file (mode 0600) for a kernel on 127.0.0.1 signing with ``key``; returns
    its content with ``path`` added."""
    info: dict[str, Any] = {"transport": "tcp", "ip": "127.0.0.1"}
    info.update(zip(CONNECTION_PORTS, _free_ports(len(CONNECTION_PORTS)), strict=True))
    info.update({"key": key.decode(), "signature_scheme": "hmac-sha256", "kernel_name": "python3"})
    runtime_dir = Path(os.environ.get("JUPYTER_RUNTIME_DIR", "/tmp/.kernelbridge"))
    runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = runtime_dir / "kernel.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    info["path"] = str(path)
    return info


class KernelProcess:
    """One kernel subprocess (Popen's vocabulary: poll, returncode, stop, kill_group)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self.output_fd = -1 if process.stdout is None else process.stdout.fileno()
        """The kernel's stdout+stderr pipe (non-blocking), or -1 without one."""
        if process.stdout is not None:
            # Non-blocking from the start: a kernel that hangs during start-up must not block the
            # agent reading what it wrote.
            os.set_blocking(self.output_fd, False)

    @classmethod
    def start(
        cls, connection_file: str, *, cwd: str, env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> KernelProcess:
        """Start ipykernel on ``connection_file`` in ``cwd``, its environment the agent's plus the
        ``mcp`` package's PYTHONPATH plus ``env``, inheriting ``pass_fds``."""
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PYTHONPATH_DIR), environment.get("PYTHONPATH")])
        )
        environment.update(env)
        process = subprocess.Popen(
            kernel_argv(connection_file),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=environment,
            pass_fds=tuple(pass_fds),
            preexec_fn=_prepare_kernel_process,
            # Its own process group: ipykernel interrupts by signalling its whole group, which
            # must reach the user's subprocesses but not the agent.
            start_new_session=True,
        )
        return cls(process)

    def __repr__(self) -> str:
        status = self._process.poll()
        return f"<KernelProcess {self.pid} {'running' if status is None else describe_exit(status)}>"

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def poll(self) -> int | None:
        """The exit status once the kernel has ended (negative: the signal), else None."""
        return self._process.poll()

    def interrupt(self) -> None:
        """SIGINT to the kernel's process group, as ipykernel's own interrupt does."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGINT)

    def stop(self, grace: float = SHUTDOWN_GRACE) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL and wait (see the module docstring).
        Returns at once if the kernel has ended."""
        if self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(grace)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def kill_group(self) -> None:
        """SIGKILL to the kernel's whole process group at once, and wait for the kernel (restart)."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self._process.wait()

    def read_output(self) -> list[str]:
        """The non-blank lines of what the kernel wrote to its stdout/stderr and is readable now."""
        if self._process.stdout is None or self._process.stdout.closed:
            return []
        try:
            data = os.read(self.output_fd, OUTPUT_CHUNK)
        except (BlockingIOError, OSError):
            return []
        return [line for line in data.decode(errors="replace").splitlines() if line.strip()]

    def close(self) -> None:
        """Close the output pipe (one pipe per kernel: a restart must not leak it)."""
        if self._process.stdout is not None:
            self._process.stdout.close()


def describe_exit(status: int | None) -> str:
    """A kernel's exit status in words."""
    if status is None:
        return "still running"
    if status >= 0:
        return f"exited with status {status}"
    name = signal.Signals(-status).name if -status in signal.valid_signals() else str(-status)
    reason = f"killed by {name}"
    if status == -signal.SIGKILL and oom_killed():
        reason += " (out of memory: the sandbox's memory limit was reached)"
    return reason


def oom_killed() -> bool:
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


def ports_taken(connection: Mapping[str, Any]) -> bool:
    """Whether a port of ``connection`` is held now: by another process, when its kernel exited
    during start-up (it lost the race for the port, between the agent choosing it and binding it)."""
    for name in CONNECTION_PORTS:
        with socket.socket() as probe:
            # As the kernel's (zmq's) bind: a port left in TIME_WAIT by the kernel's own
            # connections is free to it, one another socket listens on is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((connection["ip"], connection[name]))
            except OSError:
                return True
    return False


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
    """preexec_fn of the kernel: default SIGINT (the agent ignores it, and an ignored signal stays
    ignored across exec: interrupts must reach the kernel), SIGTERM and SIGHUP; die with the agent;
    and be the out-of-memory killer's first choice: when the sandbox's memory runs out, the kernel
    dies and the agent lives to report it (``exit`` kind ``oom``). If the agent were chosen (it may
    hold the kernel's queued output), the host would see the container end with status 137 and
    no reason."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    init.die_with_parent()
    init.prefer_for_oom_kill()
