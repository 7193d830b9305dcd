"""Orphan reaping: removing the sandbox containers of bridges that are gone.

A bridge labels each container with its pid and host name (``OWNER_LABEL``, ``HOST_LABEL``); a
container whose bridge process no longer exists on this host (it was SIGKILLed, say) is an
orphan, and the next bridge removes it at start. Containers of live bridges, and of other hosts
sharing the engine, are left alone.

A sandbox that outlives its bridge (``DURABLE_LABEL``) is no orphan while it runs: a later bridge
may adopt it, and it ends itself after its idle timeout. Once it has exited it is reaped like any
other, except those named in ``spare`` (the ones this bridge's records still name: the adopter
inspects them first, to tell the session truthfully how its sandbox ended, then removes them).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection

from kernelbridge.runtime.base import SESSION_LABEL, ContainerState, RuntimeBackend


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap_orphans(runtime: RuntimeBackend, spare: Collection[str] = ()) -> int:
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
        and not (c.durable and (c.state is ContainerState.RUNNING or c.id in spare or c.name in spare))
    ]
    await runtime.remove(orphans)
    return len(orphans)
