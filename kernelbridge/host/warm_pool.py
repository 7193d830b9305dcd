"""The warm pool: sandboxes started ahead of need, so a new session's first call skips the cold start.

A sandbox takes ~0.5 s to start (container + ipykernel), and starts are CPU bound on small
machines. The pool keeps ``size`` sandboxes started, one start at a time, and refills in the
background whenever one is taken. Every start it makes, a refill's or a session's own, waits for
its turn first (:mod:`~kernelbridge.host.admission`: a few at once on this machine) and its bound
runs from that turn. It knows nothing about sessions: :mod:`kernelbridge.session.registry`
takes sandboxes from it and closes what is left at exit (or, durable, lets go of them for the next
bridge, which adopts them into its pool: :meth:`WarmPool.add`). What it pools is whatever the starter
returns that holds a sandbox (the session layer pools each sandbox with the handlers it was
started with).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import anyio

from kernelbridge.errors import SandboxStartTimeout
from kernelbridge.host.admission import ADMISSION, StartAdmission
from kernelbridge.host.sandbox import Sandbox

log = logging.getLogger(__name__)


class Pooled(Protocol):
    """What the pool holds: a started sandbox, with whatever its starter keeps beside it."""

    @property
    def sandbox(self) -> Sandbox: ...


T = TypeVar("T", bound=Pooled)

SandboxStarter = Callable[[str], Awaitable[T]]
"""Starts a sandbox named after its first user (a session, or ``warm-<id>``) and returns it ready."""

SHUTDOWN_TIMEOUT = 15.0
"""Bound on stopping one sandbox (a container can take seconds to stop)."""
MAX_BACKOFF = 60.0
"""Longest pause between failed warm starts (a broken runtime must not make us spin)."""
REFILL_PAUSE = 0.3
"""Seconds between a sandbox taken and the start of its replacement: the one taken runs its
session's first cell meanwhile, and a start (CPU bound here; several API round trips and a
kubelet's work on a cluster) would compete with it."""


async def close_sandbox(sandbox: Sandbox) -> None:
    """Stop one sandbox, bounded and shielded (also used while being cancelled)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT) as scope:
        try:
            await sandbox.close()
        except Exception:
            log.exception("stopping sandbox %s failed", sandbox.name)
    if scope.cancelled_caught:
        log.warning("sandbox %s did not stop within %.0fs", sandbox.name, SHUTDOWN_TIMEOUT)


class WarmPool(Generic[T]):
    """Pre-started sandboxes. Run :meth:`run` in a task group; :meth:`take` one per new session."""

    def __init__(
        self, size: int, start: SandboxStarter[T], start_timeout: float, admission: StartAdmission = ADMISSION
    ) -> None:
        self.size = size
        self._start = start
        self._start_timeout = start_timeout
        self._admission = admission
        self._sandboxes: list[T] = []
        self._wanted = anyio.Event()
        self._changed = anyio.Event()
        self._starting = False
        self._claimed = False

    def __len__(self) -> int:
        return len(self._sandboxes)

    def add(self, pooled: T) -> None:
        """Pool a sandbox started elsewhere (one a bridge before this one pooled, adopted)."""
        self._sandboxes.append(pooled)
        self._notify()

    def drain(self) -> list[T]:
        """Hand over every pooled sandbox (to be closed); the pool is empty afterwards."""
        sandboxes, self._sandboxes = self._sandboxes, []
        return sandboxes

    async def take(self, name: str) -> T:
        """A started sandbox: from the pool when one is ready, else a fresh one for ``name``."""
        if not self._sandboxes and self._starting and not self._claimed:
            # A warm sandbox is half-way started (e.g. the first call right after `serve`):
            # waiting for it beats starting a second one that competes with it for CPU. Only one
            # caller claims it; others start their own in parallel.
            self._claimed = True
            try:
                with anyio.move_on_after(self._start_timeout):
                    while not self._sandboxes and self._starting:
                        await self._changed.wait()
            finally:
                self._claimed = False
        while self._sandboxes:
            pooled = self._sandboxes.pop()
            self._wanted.set()
            if pooled.sandbox.alive:
                return pooled
            await close_sandbox(pooled.sandbox)
        self._wanted.set()
        return await self._started(name)

    async def _started(self, name: str) -> T:
        """A cold start in its turn, bounded from that turn. Raises SandboxStartTimeout when the
        turn did not come in time or the start outran its own bound, else the start's failure."""
        bound = self._start_timeout + SHUTDOWN_TIMEOUT
        async with self._admission.turn(name):
            # The start's own bound fires first when the engine reports progress; this one is for
            # an engine that never answers (a pod bound to a node that died): one line to the
            # agent, not a bare TimeoutError.
            with anyio.move_on_after(bound):
                return await self._start(name)
        raise SandboxStartTimeout(f"no sandbox started within {bound:g} s (the engine never said why)")

    async def run(self) -> None:
        """Keep ``size`` sandboxes started, one start at a time (starts are CPU bound)."""
        failures = 0
        while True:
            while len(self._sandboxes) < self.size:
                self._starting = True
                try:
                    pooled = await self._started(f"warm-{secrets.token_hex(4)}")
                except Exception as exc:
                    self._starting = False
                    self._notify()
                    failures += 1
                    log.warning("starting a warm sandbox failed (%d): %s", failures, exc)
                    # Don't spin on a broken runtime; a session's own start will report the error.
                    await anyio.sleep(min(2.0**failures, MAX_BACKOFF))
                    continue
                failures = 0
                self._sandboxes.append(pooled)
                self._starting = False
                self._notify()
            self._wanted = anyio.Event()
            await self._wanted.wait()
            await anyio.sleep(REFILL_PAUSE)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
