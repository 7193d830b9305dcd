"""The agent's duties as the container's PID 1: non-dumpable, reaping orphans, handling SIGTERM/SIGHUP.

The agent is PID 1 with no init in front of it and makes itself non-dumpable (its ``/proc`` entries
become root's, ptrace is refused), so kernel code cannot reach the frame pipes through it. Orphans
of the kernel's children are re-parented to PID 1 and stay zombies until it waits for them
(:class:`Reaper`); PID 1 has no default signal actions, so SIGTERM needs a handler.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG = 1
REAP_EVERY = 1.0
"""Why once a second: each round walks /proc, and a zombie holds only a pid until then."""


def make_undumpable() -> None:
    """PR_SET_DUMPABLE=0: /proc/<agent>/fd, mem and environ become root's, and ptrace is refused,
    so kernel code (same uid) cannot reach the frame stream."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """For a child (preexec): get ``signum`` when the agent dies, so a kernel never outlives it
    (outside a container, e.g. under the local test double, nothing else would stop it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def prefer_for_oom_kill() -> None:
    """oom_score_adj=1000 for this process (raising it needs no privilege): under memory pressure
    in the container, the kernel is OOM-killed before the agent."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")


def is_init() -> bool:
    return os.getpid() == 1


def zombie_children(parent: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of ``parent``'s children that have exited but were not waited for."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after
        # the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2 and fields[0] == "Z" and fields[1] == str(parent):
            found.append(int(entry.name))
    return found


def reap_orphans(keep: Iterable[int]) -> int:
    """Wait for every zombie child except ``keep`` (children whose status someone else reads,
    e.g. the kernel's Popen). Returns how many were reaped."""
    skip = set(keep)
    reaped = 0
    for pid in zombie_children(os.getpid()):
        if pid in skip:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
            reaped += 1
    return reaped


class Reaper:
    """Reaps orphans (:func:`reap_orphans`) at most once every ``every`` seconds, and only when
    this process is PID 1 (outside a container, e.g. under the local test double, orphans go to
    the real init)."""

    def __init__(self, every: float = REAP_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._next = 0.0

    def reap(self, keep: Iterable[int]) -> None:
        """Called on every turn of the relay loop; ``keep``: children whose status someone else
        reads (the kernel's Popen)."""
        now = self._clock()
        if now < self._next or not is_init():
            return
        self._next = now + self._every
        reap_orphans(keep)


def on_terminate(handler: Callable[[], None]) -> None:
    """Call ``handler`` (from the signal handler: keep it to setting a flag) on SIGTERM/SIGHUP."""

    def handle(signum: int, frame: object) -> None:
        handler()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGHUP, handle)
