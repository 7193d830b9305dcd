"""A jupyter_client KernelProvisioner whose kernel runs in a sandbox container.

Its "kernel process" is a tunnel process (:mod:`kernelbridge.jupyter.tunnel_process`) driven over an
inherited ``socketpair`` (docs/architecture.md, "Processes"). Every wait happens inside the verb
that needs it, with no background task or thread: jupyter_client's synchronous managers run each
call in an event loop of its own. Settings are the parent manager's ``settings`` when it has them,
else the environment's. The kernel's ``cwd`` (a notebook's directory) is bound read-only on
/workspace under ``KERNELBRIDGE_MOUNTS``' rules (:func:`notebook_mount`); one that is refused leaves
/workspace empty, said in Jupyter's log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
from jupyter_client.connect import KernelConnectionInfo, LocalPortCache
from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from kernelbridge.config import Mount, Settings, check_source, load_settings, mount_guard_of
from kernelbridge.errors import ConfigError, KernelBridgeError, PortsInUse, SandboxStartTimeout, start_error
from kernelbridge.host.admission import ADMISSION
from kernelbridge.host.container import container_spec
from kernelbridge.host.policy import expected_image
from kernelbridge.jupyter.client_env import Env, display_env, terminal_size
from kernelbridge.jupyter.launch import launch_for
from kernelbridge.runtime import ContainerSpec, open_runtime
from kernelbridge.runtime.flags import WORKDIR
from kernelbridge.tunnel import ControlMessage, Exited, Interrupt, Ready, Restart, SocketControlChannel

# Why 10 s: a graceful container stop is: kernel shutdown_reply, agent exit, the runtime tearing
# the container down (~0.3 s here). Past 10 s, escalate to SIGTERM then SIGKILL.
SHUTDOWN_WAIT = 10.0
# Removing a container whose tunnel was SIGKILLed; `podman rm -f` takes ~0.3 s here.
REMOVE_TIMEOUT = 20.0
# Tunnel logs kept for post-mortems: each is at most 2 MiB (one backup).
KEEP_LOGS = 100
ANSWER_MARGIN = 5.0
"""Seconds the tunnel process gets beyond the start timeout to answer a launch or a restart: its
own bound is the start timeout, and its answer says more than ours would."""
PORT_ATTEMPTS = 3
"""Starts of one kernel when the ports jupyter_client picked were taken before the tunnel bound them."""


class SandboxProvisioner(LocalProvisioner):
    """Runs the kernel inside a sandbox container behind a kernelbridge tunnel process."""

    spec: ContainerSpec | None = None
    exit_event: Exited | None = None
    versions: dict[str, Any] | None = None
    control: SocketControlChannel | None = None
    display: Env = ()
    """The client's display settings for the sandbox (:mod:`kernelbridge.jupyter.client_env`)."""

    # -- configuration -------------------------------------------------------------------
    _settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        """The manager's settings (SandboxKernelManager), else read once from the kernel's
        environment (:meth:`pre_launch`: the kernelspec's ``env`` over the client's), else from
        this process's."""
        if self._settings is None:
            settings = getattr(self.parent, "settings", None)
            self._settings = settings if isinstance(settings, Settings) else load_settings()
        return self._settings

    @property
    def session_name(self) -> str:
        name = getattr(self.parent, "session_name", None)
        return name or f"jupyter-{self.kernel_id[:8]}"

    @property
    def container_name(self) -> str | None:
        return self.spec.name if self.spec is not None else None

    @property
    def kernel_manager(self) -> Any:
        """The KernelManager that made this provisioner (it passes itself as the parent)."""
        if self.parent is None:
            raise KernelBridgeError("a SandboxProvisioner is made by a KernelManager (its parent)")
        return self.parent

    # -- launch ------------------------------------------------------------------------------
    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Called by the KernelManager before launch_kernel: ports and the connection file (by
        LocalProvisioner), then the tunnel command instead of the kernelspec's argv."""
        km = self.kernel_manager
        # A relative connection_dir (MultiKernelManager's default) would be resolved against the
        # tunnel's working directory, not ours: make the file's path absolute first.
        if km.connection_file:
            km.connection_file = absolute(km.connection_file)
        kwargs = await super().pre_launch(**kwargs)
        if self._settings is None and not isinstance(getattr(km, "settings", None), Settings):
            # The kernelspec's env (what `kernelbridge kernelspec install` saw: the settings this
            # host needs, e.g. KERNELBRIDGE_ALLOW_UNLIMITED) over the client's own environment.
            try:
                self._settings = load_settings(kwargs.get("env") or os.environ)
            except KernelBridgeError as exc:
                self._say(exc)
                raise
        # The client's display settings, from the environment its kernel would get (allow-listed,
        # checked), and the size of the terminal it runs in: a local kernel would see both.
        stdout = sys.__stdout__
        terminal = terminal_size(stdout.fileno()) if stdout is not None else None
        self.display = display_env(kwargs.get("env") or os.environ, terminal=terminal)
        settings = self.settings
        prune_logs(settings.logs_dir)
        log_file = self._log_path()
        kwargs["cmd"] = [
            sys.executable,
            "-m",
            "kernelbridge.jupyter.tunnel_process",
            "--control-fd",
            "{control_fd}",
            "--log-file",
            str(log_file),
        ]
        return kwargs

    def _log_path(self) -> Path:
        return self.settings.logs_dir / f"kernel-{self.session_name}-{self.kernel_id[:8]}.log"

    def _log_file(self) -> Any:
        fd = os.open(self._log_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "ab")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the tunnel and wait until the sandboxed kernel is ready.

        jupyter_client picks the ports (free when it looked) and the tunnel binds them later: on a
        busy host another process may take one in between, and then new ports are picked and the
        start tried again (:data:`PORT_ATTEMPTS` times in all), as the client's connection file
        is rewritten before the client reads it.

        Raises ImageError (image missing), AgentMismatch (stale image), KernelDied or
        SandboxError (any other start failure: :func:`~kernelbridge.errors.start_error` of the
        tunnel's ``Exited``), each with a one-line reason.
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return await self._launch_once(cmd, dict(kwargs))
            except PortsInUse as exc:
                if attempt == PORT_ATTEMPTS:
                    self._say(exc)
                    raise
                self.log.warning("kernelbridge: %s; starting again on new ports", exc.reason)
                self._new_ports()
            except KernelBridgeError as exc:
                self._say(exc)
                raise
        raise AssertionError("unreachable")

    def _say(self, exc: KernelBridgeError) -> None:
        """A refused start as one line in the client's log, before jupyter_client raises it on:
        nbconvert and jupyter console then print its traceback, whose last line is the same."""
        self.log.error("kernelbridge: the sandbox kernel did not start: %s", exc)

    def _new_ports(self) -> None:
        """Fresh ports in the kernel manager and its connection file, from jupyter_client's port
        cache as LocalProvisioner takes them (the old ones stay reserved there: one is taken)."""
        km = self.kernel_manager
        km.cleanup_connection_file()
        cache = LocalPortCache.instance()
        km.shell_port, km.iopub_port, km.stdin_port, km.hb_port, km.control_port = (
            cache.find_available_port(km.ip) for _ in range(5)
        )
        km.write_connection_file()
        self.connection_info = km.get_connection_info()

    async def _launch_once(self, cmd: list[str], kwargs: dict[str, Any]) -> KernelConnectionInfo:
        self.exit_event = None
        settings = self.settings
        image, agent_hash = expected_image(settings)
        spec = container_spec(settings, self.session_name, image, agent_hash=agent_hash)
        self.spec = dataclasses.replace(spec, env=self.display)
        mount, why = notebook_mount(kwargs.get("cwd"), settings)
        if mount is not None:
            self.spec = dataclasses.replace(self.spec, mounts=(*self.spec.mounts, mount))
        elif why:
            self.log.warning("kernelbridge: %s", why)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            cmd = [part.replace("{control_fd}", str(theirs.fileno())) for part in cmd]
            kwargs = self._scrub_kwargs(kwargs)
            kwargs.update(
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                # A crash before the tunnel configures its logging still leaves a trace.
                stderr=self._log_file(),
                # The runtime's helpers inherit this: conmon drops an `oom` file in its working
                # directory after an OOM kill; it must not land wherever the user is.
                cwd=str(private_dir(settings.run_dir)),
            )
            self.process = launch_kernel(cmd, **kwargs)
        finally:
            theirs.close()
            if hasattr(kwargs.get("stderr"), "close"):
                kwargs["stderr"].close()
        self.pid = self.process.pid
        self.pgid = os.getpgid(self.pid)
        self.control = SocketControlChannel(ours)
        launch = launch_for(
            connection_file=absolute(self.kernel_manager.connection_file),
            spec=self.spec,
            agent_hash=agent_hash,
            settings=settings,
        )
        try:
            # The tunnel process waits its turn to start first (bounded: host/admission.py).
            answer = await self._ask(launch, settings.kernel_start_timeout + ADMISSION.queue_timeout)
        except TimeoutError:
            await self.kill()
            await self.cleanup()
            raise SandboxStartTimeout(
                f"the sandbox did not become ready within {settings.kernel_start_timeout:g} s"
                f" of its turn to start (waited for at most {ADMISSION.queue_timeout:g} s)"
            ) from None
        except BaseException:
            # Cancelled while starting (e.g. the client gave up): SIGTERM makes the tunnel stop
            # and remove the container on its own, in its own process.
            self.process.send_signal(signal.SIGTERM)
            raise
        if not isinstance(answer, Ready):
            self.exit_event = answer
            await self.wait()
            await self.cleanup()
            raise start_error(answer.kind, answer.reason) if answer is not None else start_error(None)
        self.versions = dict(answer.versions)
        return self.connection_info

    async def _ask(self, message: ControlMessage, timeout: float) -> Ready | Exited | None:
        """Send ``message`` to the tunnel process and wait for its answer: ``Ready``, or ``Exited``
        (None when the channel closed first). Raises TimeoutError past ``timeout`` plus
        ANSWER_MARGIN, anyio.BrokenResourceError if the tunnel is gone."""
        assert self.control is not None
        with anyio.fail_after(timeout + ANSWER_MARGIN):
            await self.control.send(message)
            while True:
                try:
                    answer = await self.control.receive()
                except anyio.EndOfStream:
                    return None
                if isinstance(answer, Ready | Exited):
                    return answer

    # -- Popen verbs -----------------------------------------------------------------------
    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and self.exit_event is None:
            self.exit_event = self._pending_exit()
        return status

    def _pending_exit(self) -> Exited | None:
        """The ``Exited`` the tunnel left on the channel before ending (read without waiting)."""
        if self.control is None:
            return None
        while (message := self.control.receive_nowait()) is not None:
            if isinstance(message, Exited):
                return message
        return None

    async def send_signal(self, signum: int) -> None:
        """SIGINT becomes an ``Interrupt``; other signals go to the tunnel process only (not its
        group), which turns SIGTERM into a graceful container stop."""
        if signum == signal.SIGINT and self.control is not None:
            with contextlib.suppress(anyio.BrokenResourceError), anyio.move_on_after(5):
                await self.control.send(Interrupt())
            return
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    async def terminate(self, restart: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    async def kill(self, restart: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()

    async def cleanup(self, restart: bool = False) -> None:
        """Called by the KernelManager after the kernel stopped: make sure the container is
        gone (the tunnel may have been SIGKILLed), then release ports unless restarting."""
        if self.spec is not None:
            try:
                with anyio.fail_after(REMOVE_TIMEOUT):
                    async with open_runtime(single_use(self.settings)) as runtime:
                        await runtime.remove([self.spec.name])
            except (TimeoutError, KernelBridgeError, OSError) as exc:
                self.log.warning("could not remove container %s: %s", self.spec.name, exc)
        if self.control is not None and self.exit_event is None:
            self.exit_event = self._pending_exit()
        if self.control is not None:
            await self.control.aclose()
            self.control = None
        await super().cleanup(restart=restart)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, SHUTDOWN_WAIT)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update({"container_name": self.container_name, "session": self.session_name})
        return info

    # -- kernelbridge additions ------------------------------------------------------------
    async def restart_in_place(self) -> bool:
        """Replace the kernel but keep its container (and so /workspace and /tmp): a ``Restart``,
        answered by a new ``Ready``. Returns False when that did not work; the caller then
        restarts the jupyter_client way."""
        if self.process is None or self.process.poll() is not None or self.control is None:
            return False
        try:
            answer = await self._ask(Restart(), self.settings.kernel_start_timeout)
        except (TimeoutError, anyio.BrokenResourceError):
            return False
        if not isinstance(answer, Ready):
            self.exit_event = answer
            return False
        self.versions = dict(answer.versions)
        return True

    def death_reason(self) -> str | None:
        """Why the sandbox ended, as reported by the agent or the runtime; None while alive."""
        if self.exit_event is None:
            return None
        return self.exit_event.reason or "the sandbox exited"


def notebook_mount(cwd: object, settings: Settings) -> tuple[Mount | None, str]:
    """The read-only mount of a kernel's ``cwd`` (a notebook's directory) on /workspace, or None and
    why not (empty when there is no ``cwd`` to mount)."""
    if not cwd:
        return None, ""
    try:
        source = check_source(str(cwd), mount_guard_of(settings), where="the notebook's directory")
    except ConfigError as exc:
        return None, f"{exc}; the kernel starts in an empty /workspace"
    nested = [mount.target for mount in settings.mounts if mount.target.startswith(WORKDIR + "/")]
    if nested:
        return None, (
            f"the notebook's directory is not mounted: KERNELBRIDGE_MOUNTS puts {nested[0]} inside"
            " /workspace; the kernel starts in an empty /workspace"
        )
    return Mount(source, WORKDIR), ""


def single_use(settings: Settings) -> Settings:
    """Settings for one runtime call from this process: a system socket or the CLI, never a
    podman service started (and stopped) just for it."""
    return dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, start_service=False))


def absolute(path: str) -> str:
    """``path`` made absolute against this process's working directory (a string op only)."""
    return path if os.path.isabs(path) else os.path.abspath(path)


def prune_logs(logs_dir: Path, keep: int = KEEP_LOGS) -> None:
    """Keep the newest ``keep`` tunnel logs (one per sandbox ever started, for post-mortems)."""
    dated = []
    for path in private_dir(logs_dir).glob("*.log*"):
        try:
            dated.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # pruned by another process meanwhile
            continue
    for _, old in sorted(dated, reverse=True)[keep:]:
        old.unlink(missing_ok=True)


def private_dir(path: Path) -> Path:
    """``path``, created if missing, readable by this user only (it holds keys and logs)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
