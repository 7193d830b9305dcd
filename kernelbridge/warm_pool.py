"""The warm pool: sandboxes started ahead of need, so a new session's first call skips the cold start.

A kernel in a sandbox takes ~0.6 s to start (container + ipykernel), and starts are CPU bound on
small machines. The pool keeps ``size`` kernels started, one start at a time, and refills in the
background whenever one is taken. It knows nothing about sessions: :mod:`kernelbridge.sessions`
takes kernels from it and stops what is left at exit.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable

import anyio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

log = logging.getLogger(__name__)

KernelHandle = tuple[AsyncKernelManager, AsyncKernelClient]
KernelFactory = Callable[[str], Awaitable[KernelHandle]]
"""Starts a kernel for the given name and returns it with a connected client."""

SHUTDOWN_TIMEOUT = 15.0
"""Bound on stopping one kernel (a container can take seconds to stop)."""
MAX_BACKOFF = 60.0
"""Longest pause between failed warm starts (a broken runtime must not make us spin)."""


async def stop_kernel(handle: KernelHandle) -> None:
    """Stop one kernel, bounded and shielded (also used while being cancelled)."""
    km, kc = handle
    with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT) as scope:
        try:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        except Exception:
            log.exception("stopping kernel %s failed", getattr(km, "kernel_id", "?"))
    if scope.cancelled_caught:
        log.warning("kernel %s did not stop within %.0fs", getattr(km, "kernel_id", "?"), SHUTDOWN_TIMEOUT)


class WarmPool:
    """Pre-started kernels. Run :meth:`run` in a task group; :meth:`take` one per new session."""

    def __init__(self, size: int, factory: KernelFactory, start_timeout: float) -> None:
        self.size = size
        self._factory = factory
        self._start_timeout = start_timeout
        self._kernels: list[KernelHandle] = []
        self._wanted = anyio.Event()
        self._changed = anyio.Event()
        self._starting = False
        self._claimed = False

    def __len__(self) -> int:
        return len(self._kernels)

    def drain(self) -> list[KernelHandle]:
        """Hand over every pooled kernel (to be stopped); the pool is empty afterwards."""
        kernels, self._kernels = self._kernels, []
        return kernels

    async def take(self, name: str) -> KernelHandle:
        """A started kernel: from the pool when one is ready, else a fresh one for ``name``."""
        if not self._kernels and self._starting and not self._claimed:
            # A warm kernel is half-way started (e.g. the first call right after `serve`): waiting
            # for it beats starting a second one that competes with it for CPU. Only one caller
            # claims it; others start their own kernels in parallel.
            self._claimed = True
            try:
                with anyio.move_on_after(self._start_timeout):
                    while not self._kernels and self._starting:
                        await self._changed.wait()
            finally:
                self._claimed = False
        if self._kernels:
            handle = self._kernels.pop()
            self._wanted.set()
            if await handle[0].is_alive():
                return handle
            await stop_kernel(handle)
        self._wanted.set()
        with anyio.fail_after(self._start_timeout + SHUTDOWN_TIMEOUT):
            return await self._factory(name)

    async def run(self) -> None:
        """Keep ``size`` kernels started, one start at a time (starts are CPU bound)."""
        failures = 0
        while True:
            while len(self._kernels) < self.size:
                self._starting = True
                try:
                    with anyio.fail_after(self._start_timeout + SHUTDOWN_TIMEOUT):
                        handle = await self._factory(f"warm-{secrets.token_hex(4)}")
                except Exception as exc:
                    self._starting = False
                    self._notify()
                    failures += 1
                    log.warning("starting a warm kernel failed (%d): %s", failures, exc)
                    # Don't spin on a broken runtime; a session's own start will report the error.
                    await anyio.sleep(min(2.0**failures, MAX_BACKOFF))
                    continue
                failures = 0
                self._kernels.append(handle)
                self._starting = False
                self._notify()
            self._wanted = anyio.Event()
            await self._wanted.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
