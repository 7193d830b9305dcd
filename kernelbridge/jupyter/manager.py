"""An AsyncKernelManager for sandboxed kernels, and a client connection that proves iopub delivers.

``SandboxKernelManager`` needs no installed kernelspec: it carries its own (the same one that
``kernelbridge kernelspec install`` writes), so the bridge, tests and nbclient can start a
sandboxed kernel with nothing but the package installed.
"""

from __future__ import annotations

import time
import uuid
from queue import Empty
from typing import Any

import anyio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.client import KernelClient
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from kernelbridge.config import Settings, load_settings
from kernelbridge.errors import KernelDied
from kernelbridge.jupyter.kernelspec import KERNEL_NAME, kernelspec_dict
from kernelbridge.jupyter.provisioner import SandboxProvisioner, private_dir

# Why 0.05 s: the host's PUB->SUB subscription propagates in ~1 ms on loopback; re-asking every
# 0.05 s keeps the handshake fast without flooding a kernel that is still busy starting.
IOPUB_PROBE_INTERVAL = 0.05
HEARTBEAT_START_WAIT = 5.0
"""Bound on the wait for a client's heartbeat thread to begin its loop (:func:`stop_channels`): a
thread begins in microseconds, and in seconds on a machine swamped with work."""
HEARTBEAT_POLL = 0.005


class SandboxKernelManager(AsyncKernelManager):
    """AsyncKernelManager whose kernel runs in a kernelbridge sandbox container."""

    def __init__(self, settings: Settings | None = None, session_name: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.settings = settings or load_settings()
        self.session_name = session_name
        self.kernel_name = KERNEL_NAME
        # After kernel_name: setting it clears the cached spec (a traitlets observer).
        self._kernel_spec = KernelSpec(**kernelspec_dict(), resource_dir="")
        self.kernel_id = self.kernel_id or str(uuid.uuid4())
        label = session_name or "kernel"
        self.connection_file = str(
            private_dir(self.settings.connections_dir) / f"kernel-{label}-{self.kernel_id[:8]}.json"
        )

    @property
    def sandbox(self) -> SandboxProvisioner | None:
        return self.provisioner if isinstance(self.provisioner, SandboxProvisioner) else None

    @property
    def container_name(self) -> str | None:
        return self.sandbox.container_name if self.sandbox else None

    @property
    def versions(self) -> dict[str, Any] | None:
        return self.sandbox.versions if self.sandbox else None

    # KernelManager declares restart_kernel as its run_sync twin; AsyncKernelManager's is a coroutine
    # (jupyter_client assigns it with an ignore of its own): the async signature is the right one.
    async def restart_kernel(self, now: bool = False, newports: bool = False, **kw: Any) -> None:  # type: ignore[override]
        """Restart the kernel inside its container, so files in /workspace and /tmp survive a
        restart as they would on a workstation; the tunnel, ports and clients stay connected.
        Falls back to jupyter_client's restart (a new container) if the sandbox cannot."""
        if not newports and self.sandbox is not None and await self.sandbox.restart_in_place():
            return
        await super().restart_kernel(now=now, newports=newports, **kw)

    def death_reason(self) -> str | None:
        """Why the kernel's sandbox ended (e.g. killed by SIGKILL, out of memory); None if alive."""
        return self.sandbox.death_reason() if self.sandbox else None


async def connect_client(km: AsyncKernelManager, timeout: float = 30.0) -> AsyncKernelClient:
    """A client with channels started, kernel_info answered and iopub proven to deliver.

    jupyter_client's ``wait_for_ready`` only proves the shell channel (and then idles 0.2 s to
    flush iopub); a SUB socket that joins late silently misses the first messages. So we ask
    kernel_info until an iopub ``status`` answering one of the requests arrives, which proves
    shell and iopub at once. Raises TimeoutError, or KernelDied if the kernel dies meanwhile.
    """
    kc: AsyncKernelClient = km.client()
    kc.start_channels()
    try:
        await wait_for_iopub(kc, timeout, km)
    except BaseException:
        stop_channels(kc)
        raise
    return kc


def stop_channels(kc: KernelClient) -> None:
    """``kc.stop_channels()``, once its heartbeat thread (if started) has begun its loop.

    jupyter_client's ``HBChannel.stop()`` sets the thread's running flag to False and its exit
    event; a thread that has not begun yet sets the flag to True again as it begins, and then takes
    every turn (the exit event set) for a missed beat and opens a new socket, until the context has
    none left: ZMQError EMFILE in the thread, a thousand sockets lingering. That is a client stopped
    right after it started on a busy machine (a kernel that died at once; a test done in a
    millisecond)."""
    wait_for_heartbeat_loop(kc)
    kc.stop_channels()


def wait_for_heartbeat_loop(kc: KernelClient) -> None:
    """Return once ``kc``'s heartbeat thread runs its loop, or is not running at all (at most
    :data:`HEARTBEAT_START_WAIT`): from then on stopping it ends it (:func:`stop_channels`)."""
    heartbeat = kc.hb_channel
    deadline = time.monotonic() + HEARTBEAT_START_WAIT
    # ``_running`` is the flag the race is about; jupyter_client has no public word for it.
    while heartbeat.is_alive() and not getattr(heartbeat, "_running", True):
        if time.monotonic() >= deadline:
            return
        time.sleep(HEARTBEAT_POLL)


async def wait_for_iopub(kc: AsyncKernelClient, timeout: float, km: AsyncKernelManager | None = None) -> None:
    sent: set[str] = set()
    with anyio.fail_after(timeout):
        while True:
            if km is not None and not await km.is_alive():
                reason = getattr(km, "death_reason", lambda: None)() or "the kernel died"
                raise KernelDied(f"the kernel died before answering: {reason}")
            sent.add(kc.kernel_info())
            probe_end = time.monotonic() + IOPUB_PROBE_INTERVAL
            while (left := probe_end - time.monotonic()) > 0:
                try:
                    msg = await kc.get_iopub_msg(timeout=left)
                except Empty:
                    break
                if msg.get("parent_header", {}).get("msg_id") in sent:
                    await _drain_replies(kc, sent)
                    return


async def _drain_replies(kc: AsyncKernelClient, sent: set[str]) -> None:
    """Consume the probe's kernel_info replies and the rest of its iopub messages, so the
    caller starts from clean channels."""
    try:
        while sent:
            reply = await kc.get_shell_msg(timeout=5.0)
            sent.discard(reply.get("parent_header", {}).get("msg_id"))
    except Empty:
        pass
    try:
        while True:
            await kc.get_iopub_msg(timeout=0.02)
    except Empty:
        return
