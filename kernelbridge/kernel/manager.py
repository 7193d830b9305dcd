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
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from kernelbridge.config import Settings, load_settings
from kernelbridge.kernel.provisioner import SandboxProvisioner, connection_dir
from kernelbridge.kernel.spec import KERNEL_NAME, kernelspec_dict

# Why 0.2 s: the host's PUB->SUB subscription propagates in ~1 ms on loopback; re-asking every
# 0.2 s keeps the handshake fast without flooding a kernel that is still busy starting.
IOPUB_PROBE_INTERVAL = 0.2


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
            connection_dir(self.settings) / f"kernel-{label}-{self.kernel_id[:8]}.json"
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

    def death_reason(self) -> str | None:
        """Why the kernel's sandbox ended (e.g. killed by SIGKILL, out of memory); None if alive."""
        return self.sandbox.death_reason() if self.sandbox else None


async def connect_client(km: AsyncKernelManager, timeout: float = 30.0) -> AsyncKernelClient:
    """A client with channels started, kernel_info answered and iopub proven to deliver.

    jupyter_client's ``wait_for_ready`` only proves the shell channel; a SUB socket that joins
    late silently misses the first messages, so we also wait for an iopub ``status`` answering
    one of our kernel_info_requests. Raises TimeoutError or RuntimeError (kernel died).
    """
    kc: AsyncKernelClient = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout)
        await wait_for_iopub(kc, timeout)
    except BaseException:
        kc.stop_channels()
        raise
    return kc


async def wait_for_iopub(kc: AsyncKernelClient, timeout: float) -> None:
    sent: set[str] = set()
    deadline = time.monotonic() + timeout
    with anyio.fail_after(timeout):
        while True:
            sent.add(kc.kernel_info())
            probe_end = min(deadline, time.monotonic() + IOPUB_PROBE_INTERVAL)
            while time.monotonic() < probe_end:
                try:
                    msg = await kc.get_iopub_msg(timeout=max(0.01, probe_end - time.monotonic()))
                except Empty:
                    break
                if msg.get("parent_header", {}).get("msg_id") in sent:
                    await _drain_replies(kc, sent)
                    return


async def _drain_replies(kc: AsyncKernelClient, sent: set[str]) -> None:
    """Consume the kernel_info replies of the probe so the caller starts from a clean shell."""
    try:
        while sent:
            reply = await kc.get_shell_msg(timeout=1.0)
            sent.discard(reply.get("parent_header", {}).get("msg_id"))
    except Empty:
        pass
    try:
        while True:  # the probe's other iopub messages (busy/idle of each kernel_info)
            await kc.get_iopub_msg(timeout=0.05)
    except Empty:
        return
