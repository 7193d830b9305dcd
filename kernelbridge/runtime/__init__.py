"""Container runtimes behind one interface of streams (see :mod:`kernelbridge.runtime.base`).

:func:`open_runtime` is the only place that decides which backend serves a bridge; nothing else
branches on runtime names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator

from kernelbridge.config import Settings
from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    HOST_LABEL,
    OWNER_LABEL,
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.cli import CliRuntime
from kernelbridge.runtime.podman import cgroup_layout, default_oci_runtime

__all__ = [
    "HOST_LABEL",
    "OWNER_LABEL",
    "SESSION_LABEL",
    "CliRuntime",
    "ContainerInfo",
    "ContainerSpec",
    "ContainerState",
    "ContainerStream",
    "RuntimeBackend",
    "RuntimeInfo",
    "cgroup_layout",
    "cli_runtime",
    "open_runtime",
    "pid_alive",
    "reap_orphans",
]


def cli_runtime(settings: Settings) -> CliRuntime:
    """The CLI backend of the configured engine, else podman when installed, else docker.

    Raises RuntimeUnavailable when neither is installed.
    """
    wanted = [settings.runtime] if settings.runtime else ["podman", "docker"]
    for name in wanted:
        engine = name.removesuffix("-cli").removesuffix("-api")
        path = shutil.which(engine)
        if not path:
            continue
        if engine == "podman":
            return CliRuntime(engine="podman", executable=path, oci_runtime=default_oci_runtime())
        return CliRuntime(engine="docker", executable=path)
    raise RuntimeUnavailable(
        f"no container runtime found ({' or '.join(wanted)} not on PATH); "
        "install podman (apt-get install podman runc) or run `make setup` as root"
    )


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[RuntimeBackend]:
    """The runtime backend for ``settings``, open for the duration of the block.

    Raises RuntimeUnavailable when no runtime can be used.
    """
    async with cli_runtime(settings) as runtime:
        yield runtime


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap_orphans(runtime: RuntimeBackend) -> int:
    """Remove sandbox containers whose owning bridge process is gone (e.g. it was SIGKILLed).

    Only containers of this host are considered (an engine may be shared by several machines).
    Returns how many were removed. Containers of live bridges are left alone.
    """
    here = socket.gethostname()
    orphans = [
        c.id or c.name
        for c in await runtime.list({SESSION_LABEL: ""})
        if c.owner_host in ("", here) and (c.owner_pid is None or not pid_alive(c.owner_pid))
    ]
    await runtime.remove(orphans)
    return len(orphans)
