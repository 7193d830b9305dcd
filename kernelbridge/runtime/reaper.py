"""Orphan reaping: removing the sandbox containers of bridges that are gone.

An orphan is a container whose bridge (``OWNER_LABEL`` pid, ``OWNER_START_LABEL``, ``HOST_LABEL``)
no longer runs on this host; containers of live bridges and of other hosts are left alone. A durable
sandbox (``DURABLE_LABEL``) is no orphan while it runs; once exited it is reaped only by a bridge of
its own state directory (``STATE_LABEL``), and not while that directory's records name it
(``spare``). A container that cannot be removed is logged while the others still go. Design:
docs/design/runtime.md.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Collection
from pathlib import Path

import anyio

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    SESSION_LABEL,
    STATE_LABEL,
    ContainerInfo,
    ContainerState,
    RuntimeBackend,
)

log = logging.getLogger(__name__)


def pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts as alive); with
    ``started`` (its :func:`process_start`), whether it is still that process and not a later one
    that was given the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start(pid) if started is not None else None
    return now is None or now == started


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``, field 22):
    with the pid, it names one process for the machine's uptime. None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
    fields = stat.rpartition(b")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def own_start() -> int | None:
    """This process's :func:`process_start`: what its containers and records say beside its pid."""
    return process_start(os.getpid())


async def reap_orphans(runtime: RuntimeBackend, spare: Collection[str] = (), state: str | None = None) -> int:
    """Remove sandbox containers whose owning bridge process is gone (e.g. it was SIGKILLed).

    Only containers of this host are considered (an engine may be shared by several machines).
    Returns how many were removed. Containers of live bridges are left alone. Raises
    RuntimeUnavailable when the engine cannot list them.
    """
    here = socket.gethostname()
    orphans = [
        c.id or c.name
        for c in await runtime.list({SESSION_LABEL: ""})
        if c.owner_host in ("", here)
        and (c.owner_pid is None or not pid_alive(c.owner_pid, c.owner_start))
        and (not c.durable or _reapable_durable(c, spare, state))
    ]
    if not orphans:
        return 0
    try:
        await runtime.remove(orphans)
    except RuntimeUnavailable:
        return await _remove_each(runtime, orphans)
    return len(orphans)


async def _remove_each(runtime: RuntimeBackend, orphans: list[str]) -> int:
    """Remove each orphan on its own, so that one the engine keeps does not keep the others;
    what is left is logged. Returns how many are gone."""
    removed = 0

    async def remove_one(container: str) -> None:
        nonlocal removed
        try:
            await runtime.remove([container])
        except RuntimeUnavailable as exc:
            log.warning("could not remove the orphaned sandbox %s: %s", container, exc)
        else:
            removed += 1

    async with anyio.create_task_group() as tg:
        for container in orphans:
            tg.start_soon(remove_one, container)
    return removed


def _reapable_durable(c: ContainerInfo, spare: Collection[str], state: str | None) -> bool:
    """A durable sandbox whose bridge is gone: reaped only once it exited, by its own state
    directory's bridge, when no record of it is left (module docstring)."""
    if c.state is ContainerState.RUNNING or c.labels.get(STATE_LABEL) != state or state is None:
        return False
    return c.id not in spare and c.name not in spare
