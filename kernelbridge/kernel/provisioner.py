"""A jupyter_client KernelProvisioner whose kernel runs in a sandbox container.

The "kernel process" jupyter_client manages is the tunnel process (``python -m
kernelbridge.tunnel``): it binds the connection file's ports on 127.0.0.1 and starts the
container, so every Popen-style verb maps onto it:

======================  ===================================================================
verb                    what happens
======================  ===================================================================
pre_launch              allocate ports (cached across restarts), write the 0600 connection
                        file, build the container argv and wrap it in the tunnel command
launch_kernel           start the tunnel; wait for its ``ready`` event (iopub proven) or
                        turn its ``exit`` event into a clear SandboxError/ImageError
poll / wait             the tunnel process; it exits when the kernel or container does
send_signal(SIGINT)     the tunnel turns it into an ``interrupt`` frame (kernelspecs use
                        message-mode interrupts through the control channel anyway)
terminate               SIGTERM: the tunnel sends ``shutdown``, closes stdin, stops the container
kill                    SIGKILL to the tunnel; ``cleanup`` then force-removes the container
cleanup                 remove the container (bounded), keep the ports on restart
restart_in_place        (ours) SIGUSR1: a new kernel in the same container, same ports
======================  ===================================================================

Settings come from the parent manager's ``settings`` attribute when it has one
(SandboxKernelManager), else from the environment (``jupyter console --kernel kernelbridge``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning import LocalProvisioner

from kernelbridge.config import Settings, load_settings
from kernelbridge.errors import AgentMismatch, ImageError, KernelBridgeError, KernelDied, SandboxError
from kernelbridge.runtime import ContainerSpec, OciCliRuntime, detect_runtime

# Why 10 s: a graceful container stop is: kernel shutdown_reply, agent exit, `podman run`
# tearing the container down (~0.3 s here). Past 10 s, escalate to SIGTERM then SIGKILL.
SHUTDOWN_WAIT = 10.0
# Removing a container whose tunnel was SIGKILLed; `podman rm -f` takes ~0.3 s here.
REMOVE_TIMEOUT = 20.0
# Tunnel logs kept for post-mortems: each is at most 2 MiB (tunnel.LOG_FILE_BYTES, one backup).
KEEP_LOGS = 100


class SandboxProvisioner(LocalProvisioner):  # type: ignore[misc]
    """Runs the kernel inside a sandbox container behind a kernelbridge tunnel process."""

    container_name: str | None = None
    exit_event: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None
    _runtime: OciCliRuntime | None = None

    # -- configuration -------------------------------------------------------------------
    _settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        """The manager's settings (SandboxKernelManager), else read once from the environment."""
        if self._settings is None:
            settings = getattr(self.parent, "settings", None)
            self._settings = settings if isinstance(settings, Settings) else load_settings()
        return self._settings

    @property
    def session_name(self) -> str:
        name = getattr(self.parent, "session_name", None)
        return name or f"jupyter-{self.kernel_id[:8]}"

    def runtime(self) -> OciCliRuntime:
        if self._runtime is None:
            self._runtime = detect_runtime(self.settings)
        return self._runtime

    def container_argv(self, agent_hash: str) -> list[str]:
        from kernelbridge.image import image_tag

        settings = self.settings
        self.container_name = f"kernelbridge-{self.session_name}-{os.urandom(3).hex()}"
        spec = ContainerSpec(
            image=settings.image or image_tag(agent_hash),
            name=self.container_name,
            session=self.session_name,
            owner_pid=os.getpid(),
            limits=settings.limits,
        )
        return self.runtime().run_argv(spec)

    # -- launch ------------------------------------------------------------------------------
    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Called by the KernelManager before launch_kernel; calls LocalProvisioner.pre_launch
        for ports and the connection file, then replaces the kernelspec argv with the tunnel."""
        from kernelbridge.image import agent_hash

        kwargs = await super().pre_launch(**kwargs)
        km = self.parent
        settings = self.settings
        prune_logs(settings.logs_dir)
        # Hashed once: it names the default image and is what the agent must match.
        expected_agent = agent_hash()
        container_argv = self.container_argv(expected_agent)
        kwargs["cmd"] = [
            sys.executable,
            "-m",
            "kernelbridge.tunnel",
            "--connection-file",
            km.connection_file,
            "--session",
            self.session_name,
            "--agent-hash",
            expected_agent,
            "--container-name",
            self.container_name,
            "--log-file",
            str(settings.logs_dir / f"{self.container_name}.log"),
            "--",
            *container_argv,
        ]
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the tunnel and wait until the sandboxed kernel is ready.

        Raises ImageError (image missing), AgentMismatch (stale image) or SandboxError (any
        other start failure), each with a one-line reason.
        """
        self.exit_event = None
        kwargs = self._scrub_kwargs(kwargs)
        kwargs["stdout"] = subprocess.PIPE
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        kwargs["stdin"] = subprocess.DEVNULL
        # The runtime's helpers inherit this: conmon drops an `oom` file in its working directory
        # when the kernel is OOM-killed, which must not land in whatever directory the user is in.
        kwargs["cwd"] = str(private_dir(self.settings.run_dir))
        self.process = launch_kernel(cmd, **kwargs)
        self.pid = self.process.pid
        self.pgid = os.getpgid(self.pid)
        try:
            event = await asyncio.wait_for(
                asyncio.to_thread(self._read_event), timeout=self.settings.kernel_start_timeout
            )
        except TimeoutError:
            await self.kill()
            await self.cleanup()
            raise SandboxError(
                f"the sandbox did not become ready within {self.settings.kernel_start_timeout:g} s"
            ) from None
        except BaseException:
            # Cancelled while starting (e.g. the client gave up). Awaiting cleanup here could be
            # cancelled again, so hand it to the tunnel: SIGTERM makes it stop and remove the
            # container on its own, in its own process.
            self.process.send_signal(signal.SIGTERM)
            raise
        if event is None or event.get("event") != "ready":
            self.exit_event = event
            await self.wait()
            await self.cleanup()
            raise start_failure(event)
        self.versions = event.get("versions")
        return self.connection_info

    def _read_event(self) -> dict[str, Any] | None:
        """Next JSON event line of the tunnel, or None at EOF. Runs in a worker thread."""
        stdout = self.process.stdout if self.process is not None else None
        if stdout is None or stdout.closed:
            return None
        for raw in stdout:
            try:
                return json.loads(raw)
            except ValueError:
                continue
        return None

    # -- Popen verbs -----------------------------------------------------------------------
    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and self.exit_event is None and self.process is not None:
            self.exit_event = await asyncio.to_thread(self._read_event)
        return status

    async def send_signal(self, signum: int) -> None:
        """Signals go to the tunnel process only (not its group): it turns SIGINT into an
        ``interrupt`` frame and SIGTERM into a graceful container stop."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def kill(self, restart: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()

    async def cleanup(self, restart: bool = False) -> None:
        """Called by the KernelManager after the kernel stopped: make sure the container is
        gone (the tunnel may have been SIGKILLed), then release ports unless restarting."""
        if self.container_name:
            try:
                await asyncio.wait_for(self.runtime().remove([self.container_name]), REMOVE_TIMEOUT)
            except (TimeoutError, KernelBridgeError, OSError) as exc:
                self.log.warning("could not remove container %s: %s", self.container_name, exc)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        await super().cleanup(restart=restart)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, SHUTDOWN_WAIT)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update({"container_name": self.container_name, "session": self.session_name})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.container_name = provisioner_info.get("container_name")

    # -- kernelbridge additions ------------------------------------------------------------
    async def restart_in_place(self) -> bool:
        """Replace the kernel but keep its container (and so /workspace and /tmp): SIGUSR1
        makes the tunnel send a ``restart`` frame, answered by a new ``ready``. Returns False
        when that did not work; the caller then restarts the jupyter_client way."""
        if self.process is None or self.process.poll() is not None:
            return False
        self.process.send_signal(signal.SIGUSR1)
        try:
            event = await asyncio.wait_for(
                asyncio.to_thread(self._read_event), timeout=self.settings.kernel_start_timeout
            )
        except TimeoutError:
            return False
        if event is None or event.get("event") != "ready":
            self.exit_event = event
            return False
        self.versions = event.get("versions")
        return True

    def death_reason(self) -> str | None:
        """Why the sandbox ended, as reported by the agent or the runtime; None while alive."""
        if self.exit_event is None:
            return None
        return str(self.exit_event.get("reason") or "the sandbox exited")


def start_failure(event: dict[str, Any] | None) -> SandboxError:
    """Translate the tunnel's exit event into the matching kernelbridge error."""
    reason = str((event or {}).get("reason") or "the tunnel process exited without a reason")
    lowered = reason.lower()
    if reason.startswith("agent_mismatch"):
        return AgentMismatch(reason.removeprefix("agent_mismatch: "))
    if "image not known" in lowered or "unable to find image" in lowered or "no such image" in lowered:
        return ImageError(f"the sandbox image is missing ({reason}); run `kernelbridge image build`")
    if "kernel exited" in lowered:
        return KernelDied(reason)
    return SandboxError(f"the sandbox failed to start: {reason}")


def prune_logs(logs_dir: Path, keep: int = KEEP_LOGS) -> None:
    """Keep the newest ``keep`` tunnel logs (one per sandbox ever started, for post-mortems)."""
    dated = []
    for path in private_dir(logs_dir).glob("*.log*"):
        try:
            dated.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # pruned by another bridge meanwhile
            continue
    for _, old in sorted(dated, reverse=True)[keep:]:
        old.unlink(missing_ok=True)


def private_dir(path: Path) -> Path:
    """``path``, created if missing, readable by this user only (it holds keys and logs)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
