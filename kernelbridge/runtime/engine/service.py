"""Helper processes an engine backend may own: its own ``podman system service``, an ssh forward.

Each is ONE process per engine (never per sandbox), started with a bounded wait until the engine
answers through it, and stopped by the backend's ``aclose`` (SIGTERM, a bounded wait, SIGKILL).
Where ``setpriv`` exists the helper also gets a parent-death signal, so a bridge killed with
SIGKILL does not leave a service running forever (``--time=0`` never idles out).

Why an ``ssh -L`` forward rather than ``ssh host docker system dial-stdio`` per connection: the
pool opens a connection per concurrent call and every attached sandbox holds one for its life, so
dial-stdio would cost an ssh process, an ssh handshake (~0.1-0.3 s) and a remote client process
per sandbox; one forward multiplexes all of them as channels of one ssh connection, and the pool
sees a plain unix socket.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.engine.endpoint import UNIX_PATH_MAX, Endpoint
from kernelbridge.runtime.process import end_process

START_TIMEOUT = 20.0
"""Bound of a helper's start until the engine answers through it: podman's service answers in
~0.3 s here, an ssh forward in one handshake; a loaded machine may take several seconds."""
STOP_GRACE = 5.0
"""SIGTERM -> SIGKILL: podman's service drains its connections within this."""
POLL_INTERVAL = 0.05
LOG_TAIL = 3


class HelperProcess:
    """A long-running helper process with its output in a log file."""

    def __init__(self, what: str, argv: list[str], log_path: Path, cwd: Path | None = None) -> None:
        self.what = what
        self.cwd = cwd
        self.argv = argv
        self.log_path = log_path
        self._process: anyio.abc.Process | None = None
        self._cleanup: list[Path] = []

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def remove_on_stop(self, path: Path) -> None:
        self._cleanup.append(path)

    async def start(self, ready: Callable[[], Awaitable[bool]], timeout: float = START_TIMEOUT) -> None:
        """Start the process and poll ``ready`` until it says yes, the process dies or
        ``timeout`` passes. Raises RuntimeUnavailable (with the log's last lines)."""
        argv = self.argv
        setpriv = shutil.which("setpriv")
        if setpriv:
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.cwd:
            self.cwd.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A local file, opened before the child runs: blocking for microseconds at most.
        with self.log_path.open("ab") as log:
            try:
                self._process = await anyio.open_process(
                    argv, stdin=None, stdout=log, stderr=log, cwd=self.cwd, start_new_session=True
                )
            except OSError as exc:
                raise RuntimeUnavailable(f"cannot start {self.what}: {exc.strerror or exc}") from None
        try:
            with anyio.fail_after(timeout):
                while not await ready():
                    if self._process.returncode is not None:
                        raise RuntimeUnavailable(
                            f"{self.what} exited with status {self._process.returncode}: {self.log_tail()}"
                        )
                    await anyio.sleep(POLL_INTERVAL)
        except TimeoutError:
            await self.stop()
            tail = self.log_tail()
            raise RuntimeUnavailable(f"{self.what} did not answer within {timeout:g} s: {tail}") from None
        except BaseException:
            await self.stop()
            raise

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(line.strip()[:300] for line in lines[-LOG_TAIL:]) or "no output"

    async def stop(self) -> None:
        """SIGTERM, wait up to :data:`STOP_GRACE`, SIGKILL. Idempotent; shielded from cancellation."""
        process, self._process = self._process, None
        with anyio.CancelScope(shield=True):
            if process is not None:
                # The whole session: setpriv execs, but podman may have children of its own.
                await end_process(process, ask=signal.SIGTERM, grace=STOP_GRACE, group=True)
                await process.aclose()
            for path in self._cleanup:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:  # a state directory gone read-only must not turn an exit into a traceback
                    with contextlib.suppress(OSError):
                        path.unlink(missing_ok=True)
            self._cleanup.clear()


_HELPERS = itertools.count(1)


def helper_tag() -> str:
    """Our pid and a count: a name no other process's helper, nor another of ours, has."""
    return f"{os.getpid()}-{next(_HELPERS)}"


def socket_path(run_dir: Path, name: str) -> tuple[Path, Path | None]:
    """A path for a socket we bind, under ``run_dir`` when it fits ``sun_path``, else in a fresh
    private directory under the system's temp dir; returns it and the directory to remove (if any)."""
    path = run_dir / name
    if len(str(path)) <= UNIX_PATH_MAX:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.unlink(missing_ok=True)  # a stale socket of a crashed bridge with our pid
        return path, None
    private = Path(tempfile.mkdtemp(prefix="kernelbridge-"))
    return private / name, private


def podman_service(
    run_dir: Path, oci_runtime: str | None, podman: str = "podman"
) -> tuple[HelperProcess, Path]:
    """A ``podman system service`` of this bridge, on a socket of its own (two bridges sharing a
    state directory, or two runtimes in one process, must not share, or stop, one service)."""
    tag = helper_tag()
    sock, private = socket_path(run_dir, f"podman-{tag}.sock")
    argv = [podman]
    if oci_runtime:
        argv += ["--runtime", oci_runtime]
    # --time=0: never exit on idle (an idle bridge still owns attached sandboxes).
    argv += ["system", "service", "--time=0", f"unix://{sock}"]
    # Its own working directory: conmon, which the service spawns per container, drops an "oom"
    # marker file into its working directory after an OOM kill.
    cwd = run_dir / f"podman-service-{tag}"
    helper = HelperProcess("podman system service", argv, run_dir / f"podman-service-{tag}.log", cwd)
    helper.remove_on_stop(private or sock)
    helper.remove_on_stop(cwd)
    return helper, sock


def ssh_forward(
    endpoint: Endpoint, remote_socket: str, run_dir: Path, ssh: tuple[str, ...] = ("ssh",)
) -> tuple[HelperProcess, Path]:
    """An ``ssh -NL local.sock:remote.sock`` forward to ``endpoint``'s engine socket."""
    tag = f"{helper_tag()}-{zlib.crc32(endpoint.url.encode()) % 10**8}"
    sock, private = socket_path(run_dir, f"ssh-{tag}.sock")
    target = f"{endpoint.user}@{endpoint.host}" if endpoint.user else endpoint.host
    argv = [
        *ssh, "-N", "-T",
        # Never prompt (no terminal here): keys or an agent must be set up, as for `docker -H ssh://`.
        "-o", "BatchMode=yes",
        "-o", "ExitOnForwardFailure=yes",
        "-o", "StreamLocalBindUnlink=yes",
        "-o", "ConnectTimeout=10",
        # A dead link is noticed within ~45 s instead of TCP's hours.
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=3",
        "-p", str(endpoint.port),
        "-L", f"{sock}:{remote_socket}",
        target,
    ]  # fmt: skip
    helper = HelperProcess(f"ssh forward to {endpoint.url}", argv, run_dir / f"ssh-{tag}.log")
    helper.remove_on_stop(private or sock)
    return helper, sock
