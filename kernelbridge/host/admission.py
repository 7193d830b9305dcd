"""Cold starts admitted a few at a time, machine-wide: a start's bound runs from its turn.

``async with ADMISSION.turn(name): <create, attach, wait for ready>``. At most :data:`SLOTS` starts
of this user's kernelbridge processes run at once on this machine (an exclusive ``flock`` on one of
that many files in :func:`slots_directory`, let go with a dying process's descriptors); the wait is
bounded (:data:`QUEUE_TIMEOUT`, then SandboxStartTimeout) and logged past :data:`SAID_AFTER`. A slots
directory that is not privately ours limits the turns to this process (said once). Starts on another
machine's engine are not counted. Design: docs/design/host.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from kernelbridge.errors import SandboxStartTimeout

log = logging.getLogger(__name__)

SLOTS = max(2, 2 * (os.cpu_count() or 1))
"""Starts at once: twice the cores (a start also waits on the engine and the container's
set-up, during which another can use the CPU). 20 starts on 2 cores: see docs/architecture.md."""
QUEUE_TIMEOUT = 120.0
"""Bound on waiting for a turn: 20 starts queued behind 4 slots take ~40 s on a loaded 2-core
machine; past this the machine is starting more than it can."""
SAID_AFTER = 1.0
"""A wait longer than this is logged (how long, behind how many slots)."""
POLL = 0.05
"""How often a waiter looks for a slot another process let go of."""


def slots_directory() -> Path:
    """Where this user's slots live: ``$XDG_RUNTIME_DIR/kernelbridge`` when that is set, else
    ``<tmp>/kernelbridge-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime:
        return Path(runtime) / "kernelbridge" / "start-slots"
    return Path(tempfile.gettempdir()) / f"kernelbridge-{os.getuid()}" / "start-slots"


class StartAdmission:
    """Turns to start a sandbox: ``async with admission.turn(name): <create, attach, wait ready>``."""

    def __init__(
        self, directory: Path | None = None, slots: int = SLOTS, queue_timeout: float = QUEUE_TIMEOUT
    ) -> None:
        self.directory = directory or slots_directory()
        self.slots = slots
        self.queue_timeout = queue_timeout
        self._queue = anyio.Lock()  # FIFO: the first waiter of this process polls for a slot
        self._local = anyio.Semaphore(slots)
        """Holds this process to ``slots`` too when the directory cannot be used."""
        self._shared: bool | None = None

    @contextlib.asynccontextmanager
    async def turn(self, name: str) -> AsyncIterator[float]:
        """Wait for a turn to start sandbox ``name`` (yields how many seconds it waited); the
        turn ends with the block. Raises SandboxStartTimeout past :attr:`queue_timeout`."""
        began = time.monotonic()
        fd: int | None = None
        with anyio.move_on_after(self.queue_timeout) as waiting:
            await self._local.acquire()
            try:
                async with self._queue:
                    fd = await self._free_slot()
            except BaseException:
                self._local.release()
                raise
        waited = time.monotonic() - began
        if waiting.cancelled_caught:
            raise SandboxStartTimeout(
                f"the sandbox did not get its turn to start within {self.queue_timeout:g} s: other"
                f" sandboxes held all {self.slots} start slots of this machine (too many starting at once)"
            )
        if waited > SAID_AFTER:
            log.info("sandbox %s waited %.1f s for its turn to start (%d at once)", name, waited, self.slots)
        try:
            yield waited
        finally:
            self._local.release()
            if fd is not None:
                os.close(fd)  # the only descriptor of this open file: its flock goes with it

    async def _free_slot(self) -> int | None:
        """A descriptor holding a slot's flock (None: no shared directory; this process's own
        semaphore is the turn). Polls until one is free; cancelled by the caller's bound."""
        while True:
            if not self._shared_ok():
                return None
            for index in range(self.slots):
                fd = self._try(index)
                if fd is not None or not self._shared:
                    return fd
            await anyio.sleep(POLL)

    def _try(self, index: int) -> int | None:
        path = self.directory / f"slot-{index}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._give_up(f"cannot open {path}: {exc.strerror}")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _shared_ok(self) -> bool:
        """Whether the slots' directory is usable: ours, a directory, private (checked once)."""
        if self._shared is None:
            try:
                self.directory.parent.mkdir(exist_ok=True, mode=0o700)
                self.directory.mkdir(exist_ok=True, mode=0o700)
                ours = all(_private_dir(os.lstat(d)) for d in (self.directory.parent, self.directory))
            except OSError as exc:
                self._give_up(f"cannot make {self.directory}: {exc.strerror}")
                return False
            if not ours:  # another user's: they could hold every slot, or swap the files
                self._give_up(f"{self.directory} is not a private directory of this user")
                return False
            self._shared = True
        return self._shared

    def _give_up(self, why: str) -> None:
        if self._shared is not False:
            log.warning("start turns are counted in this process only: %s", why)
        self._shared = False


def _private_dir(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


ADMISSION = StartAdmission()
"""This process's turns (one per process: every start of the process waits in its one queue)."""
