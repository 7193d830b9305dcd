"""The sandbox's flags (:mod:`kernelbridge.runtime.flags`) as the engine API's container-create body.

A renderer only: every decision is the flags'. No I/O.
"""

from __future__ import annotations

from typing import Any

from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.flags import SandboxFlags, sandbox_flags


def host_config(flags: SandboxFlags) -> dict[str, Any]:
    memory = flags.memory_bytes
    return {
        "NetworkMode": flags.network,
        "CapDrop": list(flags.cap_drop),
        "SecurityOpt": ["no-new-privileges"] if flags.no_new_privileges else [],
        "ReadonlyRootfs": flags.read_only,
        "Memory": memory,
        "MemorySwap": memory,
        "PidsLimit": flags.pids,
        "NanoCpus": int(flags.cpus * 1e9),
        "Tmpfs": {mount.path: mount.options for mount in flags.tmpfs},
        "Binds": [f"{b.source}:{b.target}:{','.join(b.options)}" for b in flags.binds],
        "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in flags.ulimits],
        "Init": flags.init,
        "AutoRemove": flags.auto_remove,
        "LogConfig": {"Type": flags.log_driver, "Config": {}},
        "RestartPolicy": {"Name": "no"},
    }


def create_body(spec: ContainerSpec) -> dict[str, Any]:
    """The JSON body of ``POST /containers/create`` for ``spec`` (the name goes in the query)."""
    flags = sandbox_flags(spec)
    body: dict[str, Any] = {
        "Image": flags.image,
        "Labels": flags.labels,
        "Env": [f"{key}={value}" for key, value in flags.env],
        "User": flags.user,
        "WorkingDir": flags.workdir,
        "OpenStdin": True,
        "StdinOnce": flags.stdin_once,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "NetworkDisabled": flags.network_disabled,
        "HostConfig": host_config(flags),
    }
    if flags.command:
        body["Cmd"] = list(flags.command)
    return body
