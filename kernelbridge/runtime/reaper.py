"""Orphan reaping: removing the sandbox containers of bridges that are gone.

A bridge labels each container with its pid and host name (``OWNER_LABEL``, ``HOST_LABEL``); a
container whose bridge process no longer exists on this host (it was SIGKILLed, say) is an
orphan, and the next bridge removes it at start. Containers of live bridges, and of other hosts
sharing the engine, are left alone.

A sandbox that outlives its bridge (``DURABLE_LABEL``) is no orphan while it runs: a later bridge
may adopt it, and it ends itself after its idle timeout. Once it has exited it is reaped only by a
bridge of its own state directory (``STATE_LABEL`` is ``state``), and not while that directory's
records name it (``spare``: the adopter inspects it first, to tell the session truthfully how its
sandbox ended, then removes it). An exited sandbox holds no process; another installation's is
that installation's to explain and remove.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection

from kernelbridge.runtime.base import (
    SESSION_LABEL,
    STATE_LABEL,
    ContainerInfo,
    ContainerState,
    RuntimeBackend,
)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap_orphans(runtime: RuntimeBackend, spare: Collection[str] = (), state: str | None = None) -> int:
    """Remove sandbox containers whose owning bridge process is gone (e.g. it was SIGKILLed).

    Only containers of this host are considered (an engine may be shared by several machines).
    Returns how many were removed. Containers of live bridges are left alone.
    """
    here = socket.gethostname()
    orphans = [
        c.id or c.name
        for c in await runtime.list({SESSION_LABEL: ""})
        if c.owner_host in ("", here)
        and (c.owner_pid is None or not pid_alive(c.owner_pid))
        and (not c.durable or _reapable_durable(c, spare, state))
    ]
    await runtime.remove(orphans)
    return len(orphans)


def _reapable_durable(c: ContainerInfo, spare: Collection[str], state: str | None) -> bool:
    """A durable sandbox whose bridge is gone: reaped only once it exited, by its own state
    directory's bridge, when no record of it is left (module docstring)."""
    if c.state is ContainerState.RUNNING or c.labels.get(STATE_LABEL) != state or state is None:
        return False
    return c.id not in spare and c.name not in spare
