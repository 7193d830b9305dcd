"""Starting a sandbox container: its spec from the settings, and create + attach with cleanup.

Shared by the bridge's in-process sandboxes (:mod:`kernelbridge.kernel.sandbox`) and the tunnel
process that plain Jupyter clients get (:mod:`kernelbridge.kernel.tunnel_process`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from kernelbridge import frames
from kernelbridge.config import SandboxLimits, Settings
from kernelbridge.errors import AgentMismatch, ImageError, KernelDied, SandboxError
from kernelbridge.frames import (
    EXIT_AGENT_MISMATCH,
    EXIT_IMAGE_MISSING,
    EXIT_KERNEL_DIED,
    EXIT_OOM,
    EXIT_START_TIMEOUT,
)
from kernelbridge.runtime import ContainerSpec, ContainerStream, RuntimeBackend

log = logging.getLogger(__name__)

# Why 20 s: removing a container takes ~0.3 s here; a busy engine can take seconds; past this
# the engine is wedged and the owner label lets the next start reap the container.
REMOVE_TIMEOUT = 20.0


def container_spec(settings: Settings, session: str, image: str) -> ContainerSpec:
    """The sandbox container of ``session``; its name carries a random suffix (a restart racing
    the old container's removal, or two bridges, would otherwise collide)."""
    return ContainerSpec(
        image=image,
        name=f"kernelbridge-{session}-{secrets.token_hex(3)}",
        session=session,
        owner_pid=os.getpid(),
        owner_host=socket.gethostname(),
        limits=settings.limits,
        labels=settings.labels,
    )


def expected_image(settings: Settings) -> tuple[str, str | None]:
    """(image, the agent hash the host expects inside it or None to accept the image's own).

    An explicit ``KERNELBRIDGE_IMAGE`` is used as given; without one, the image named after this
    kernelbridge's own agent hash.
    """
    from kernelbridge.image import agent_hash, image_tag

    if settings.image:
        return settings.image, None
    expected = agent_hash()
    return image_tag(expected), expected


@contextlib.asynccontextmanager
async def started_container(
    runtime: RuntimeBackend, spec: ContainerSpec
) -> AsyncIterator[tuple[str, ContainerStream]]:
    """Create and attach a container; on exit (or a failure half-way) close the stream and remove
    the container, shielded and bounded. Raises ImageError / RuntimeUnavailable from the runtime."""
    container = await runtime.create(spec)
    stream: ContainerStream | None = None
    try:
        stream = await runtime.attach(container)
        yield container, stream
    finally:
        with anyio.CancelScope(shield=True):
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()
            with anyio.move_on_after(REMOVE_TIMEOUT) as scope:
                try:
                    await runtime.remove([container])
                except Exception as exc:
                    log.warning("could not remove container %s: %s", spec.name, exc)
            if scope.cancelled_caught:
                log.warning(
                    "removing container %s took over %.0f s; left for reaping", spec.name, REMOVE_TIMEOUT
                )


def launch_frame(
    *, connection_file: str, spec: ContainerSpec, agent_hash: str | None, settings: Settings
) -> frames.Frame:
    """The ``launch`` frame the provisioner sends first."""
    container = {
        "image": spec.image,
        "name": spec.name,
        "session": spec.session,
        "owner_pid": spec.owner_pid,
        "owner_host": spec.owner_host,
        "labels": [list(pair) for pair in spec.labels],
    }
    return {
        "type": frames.LAUNCH,
        "connection_file": connection_file,
        "agent_hash": agent_hash,
        "container": container,
        "limits": _limits_dict(settings.limits),
        "runtime": settings.runtime,
        "engine": _engine_dict(settings),
        "state_dir": str(settings.state_dir),
        "start_timeout": settings.kernel_start_timeout,
    }


def _engine_dict(settings: Settings) -> dict[str, Any]:
    engine = dataclasses.asdict(settings.engine)
    engine["cert_path"] = str(engine["cert_path"]) if engine["cert_path"] else None
    return engine


def _limits_dict(limits: SandboxLimits) -> dict[str, Any]:
    return {name: getattr(limits, name) for name in limits.__slots__}  # type: ignore[attr-defined]


def start_failure(exit_frame: dict[str, Any] | None, stderr: list[str], oom: bool = False) -> SandboxError:
    """The error for a sandbox that ended before it was ready, by the exit frame's kind."""
    kind = (exit_frame or {}).get("kind")
    reason = str((exit_frame or {}).get("reason") or "")
    detail = next((line for line in reversed(stderr) if line.strip()), "")
    if kind == EXIT_AGENT_MISMATCH:
        return AgentMismatch(reason)
    if kind == EXIT_IMAGE_MISSING:
        return ImageError(reason)
    if oom or kind == EXIT_OOM:
        return KernelDied(f"the kernel ran out of memory while starting ({reason or 'killed'})")
    if kind == EXIT_KERNEL_DIED:
        return KernelDied(reason or "the kernel exited while starting")
    if kind == EXIT_START_TIMEOUT:
        return SandboxError(reason)
    why = reason or detail or "the container exited before its kernel was ready"
    return SandboxError(f"the sandbox failed to start: {why}")


def new_connection(ip: str = "127.0.0.1") -> dict[str, Any]:
    """Connection info with port 0 everywhere (bound to free ports by the tunnel) and a fresh key."""
    return {
        "transport": "tcp",
        "ip": ip,
        "shell_port": 0,
        "iopub_port": 0,
        "stdin_port": 0,
        "control_port": 0,
        "hb_port": 0,
        "key": secrets.token_hex(32),
        "signature_scheme": "hmac-sha256",
        "kernel_name": "kernelbridge",
    }


def write_connection_file(path: Path, connection: dict[str, Any]) -> None:
    """Write ``connection`` (mode 0600, in a 0700 directory) atomically: it holds the host key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(connection, f, indent=1)
    os.replace(tmp, path)
