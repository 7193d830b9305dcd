"""A :class:`ContainerSpec` as the engine API's container-create body (no I/O).

These are the sandbox flags of DESIGN.md ("Sandbox container") in the API's words, the same
settings ``oci.run_argv`` spells as CLI flags, with two deliberate differences:

- no init process (``Init: false``): the agent runs as PID 1 itself. An init process holding the
  frame pipes would be reachable from kernel code (same uid, ``/proc/1/fd``);
- no auto-removal: containers are removed explicitly, so that ``inspect`` can still tell the exit
  code and the OOM flag after the container exited.

``kube.pod_manifest`` reads the same limits through :func:`size_bytes` and :func:`tmpfs_options`.
"""

from __future__ import annotations

import re
from typing import Any

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime.base import READ_ONLY_TMPFS, WORKDIR, ContainerSpec

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmg]?)$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}

LOG_DRIVER = "none"
"""Nothing reads an engine's log of a sandbox (the tunnel is the only consumer of its stdio), and
both engines' default drivers (docker's json-file, podman's k8s-file) write every byte the kernel
prints to disk. ``none`` still lets us attach; podman's faster ``passthrough`` cannot be used over
the API (it hands the container the stdio of the service process, leaving nothing to attach to)."""


def size_bytes(size: str) -> int:
    """``512m`` -> 536870912 (binary units, as docker and podman read ``--memory``).

    Raises ValueError on a malformed size (settings validate sizes before they get here).
    """
    match = _SIZE.match(size.strip())
    if not match:
        raise ValueError(f"not a size: {size!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def tmpfs_options(size: str) -> str:
    """Mount options of a sandbox tmpfs: sized (unsized, podman's /tmp under --read-only is a huge
    tmpfs counted against the memory limit), world-writable and sticky, no set-uid, no devices."""
    return f"rw,size={size},mode=1777,nosuid,nodev"


def host_config(limits: SandboxLimits) -> dict[str, Any]:
    memory = size_bytes(limits.memory)
    return {
        "NetworkMode": limits.network,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "ReadonlyRootfs": limits.read_only,
        "Memory": memory,
        # Swap limited to the memory limit: the kernel cannot page out past it.
        "MemorySwap": memory,
        "PidsLimit": limits.pids,
        "NanoCpus": int(limits.cpus * 1e9),
        "Tmpfs": {
            "/tmp": tmpfs_options(limits.tmp_size),
            WORKDIR: tmpfs_options(limits.workspace_size),
            # podman's read-only root also puts *unsized*, writable tmpfs on /run and /var/tmp:
            # empty read-only ones instead (the CLI backend does the same).
            **({"/var/tmp": READ_ONLY_TMPFS, "/run": READ_ONLY_TMPFS} if limits.read_only else {}),
        },
        # Explicit ulimits: the engine's defaults would be raised past what may be set without
        # CAP_SYS_RESOURCE on these machines, and the container would fail to start.
        "Ulimits": [
            {"Name": "nofile", "Soft": limits.nofile, "Hard": limits.nofile},
            {"Name": "nproc", "Soft": limits.nproc, "Hard": limits.nproc},
        ],
        "Init": False,
        "AutoRemove": False,
        "LogConfig": {"Type": LOG_DRIVER, "Config": {}},
        "RestartPolicy": {"Name": "no"},
    }


def create_body(spec: ContainerSpec) -> dict[str, Any]:
    """The JSON body of ``POST /containers/create`` for ``spec``."""
    body: dict[str, Any] = {
        "Image": spec.image,
        "Labels": spec.all_labels(),
        "Env": [f"{key}={value}" for key, value in spec.env],
        "User": spec.limits.user,
        "WorkingDir": WORKDIR,
        # stdin open and closed for good when the (one) attached client half-closes: the agent
        # sees EOF and exits, as with `run -i`.
        "OpenStdin": True,
        "StdinOnce": True,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "NetworkDisabled": spec.limits.network == "none",
        "HostConfig": host_config(spec.limits),
    }
    if spec.command:
        body["Cmd"] = list(spec.command)
    return body
