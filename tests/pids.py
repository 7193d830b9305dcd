"""A pid for tests that need the owner of something to be gone, without starting a process."""

from __future__ import annotations

from pathlib import Path


def no_such_pid() -> int:
    """A pid no process can have: one above the kernel's ``pid_max`` (a bridge that has exited)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
