"""Container runtimes: pick one, build the sandbox argv, find and remove containers.

``detect_runtime`` is the only place that decides between podman and docker.
"""

from __future__ import annotations

import os
import shutil

from kernelbridge.config import Settings
from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    OWNER_LABEL,
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    RuntimeBackend,
)
from kernelbridge.runtime.docker import DockerRuntime
from kernelbridge.runtime.oci import OciCliRuntime
from kernelbridge.runtime.podman import PodmanRuntime, cgroup_layout, default_oci_runtime

__all__ = [
    "OWNER_LABEL",
    "SESSION_LABEL",
    "ContainerInfo",
    "ContainerSpec",
    "DockerRuntime",
    "OciCliRuntime",
    "PodmanRuntime",
    "RuntimeBackend",
    "cgroup_layout",
    "detect_runtime",
    "pid_alive",
    "reap_orphans",
]


def detect_runtime(settings: Settings) -> OciCliRuntime:
    """The configured runtime, else podman when installed, else docker.

    Raises RuntimeUnavailable when none is installed.
    """
    wanted = [settings.runtime] if settings.runtime else ["podman", "docker"]
    for name in wanted:
        path = shutil.which(name)
        if not path:
            continue
        if name == "podman":
            return PodmanRuntime(executable=path, oci_runtime=default_oci_runtime())
        return DockerRuntime(executable=path)
    raise RuntimeUnavailable(
        f"no container runtime found ({' or '.join(wanted)} not on PATH); "
        "install podman (apt-get install podman runc) or run `make setup` as root"
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap_orphans(settings: Settings, runtime: OciCliRuntime | None = None) -> int:
    """Remove sandbox containers whose owning bridge process is gone (e.g. it was SIGKILLed).

    Returns how many were removed. Containers of live bridges are left alone.
    """
    runtime = runtime or detect_runtime(settings)
    orphans = [
        c.name
        for c in await runtime.list_containers({SESSION_LABEL: ""})
        if c.owner_pid is None or not pid_alive(c.owner_pid)
    ]
    await runtime.remove(orphans)
    return len(orphans)
