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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from kernelbridge import frames
from kernelbridge.config import SandboxLimits, Settings
from kernelbridge.errors import AgentMismatch, ImageError, KernelBridgeError, KernelDied, SandboxError
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


NAMESPACE_LABEL = "kernelbridge.namespace"
"""The HTTP client (token name) a sandbox serves; absent over stdio."""


def container_spec(settings: Settings, session: str, image: str) -> ContainerSpec:
    """The sandbox container of ``session``; its name carries a random suffix (a restart racing
    the old container's removal, or two bridges, would otherwise collide) and, over HTTP, the
    namespace of the client it serves (two clients may both call a session ``default``)."""
    prefix = f"kernelbridge-{settings.namespace}-" if settings.namespace else "kernelbridge-"
    labels = settings.labels
    if settings.namespace:
        labels = (*labels, (NAMESPACE_LABEL, settings.namespace))
    return ContainerSpec(
        image=image,
        name=f"{prefix}{session}-{secrets.token_hex(3)}",
        # The session label names the namespace too: two clients' "default" stay apart.
        session=f"{settings.namespace}/{session}" if settings.namespace else session,
        owner_pid=os.getpid(),
        owner_host=socket.gethostname(),
        limits=settings.limits,
        labels=labels,
    )


def expected_image(settings: Settings) -> tuple[str, str]:
    """(image, the agent hash the host expects inside it).

    An explicit ``KERNELBRIDGE_IMAGE`` is used as given (:func:`verify_image` checks its labels);
    without one, the image named after this kernelbridge's own files and the configured extra
    packages. Either way the agent in the image must be this kernelbridge's: the agent itself
    refuses a host that expects another one. Raises ConfigError for a bad extras setting.
    """
    from kernelbridge.image import agent_hash, default_image, extras_from_settings

    expected = agent_hash()
    if settings.image:
        return settings.image, expected
    return default_image(extras_from_settings(settings)), expected


async def verify_image(
    runtime: RuntimeBackend, image: str, expected_agent: str, *, explicit: bool = True
) -> dict[str, str]:
    """The labels of ``image``, once they show a kernelbridge image with the agent ``expected_agent``.

    Raises ImageError with one line (missing image, a plain image such as ``python:3.14-slim``
    that has no agent to talk to, an image of another kernelbridge) and how to build the right one.
    Checking before starting matters for a plain image: its own command would read our frames as
    input and never answer, so the start would only fail at its timeout.
    """
    from kernelbridge.image import check_labels

    labels = await runtime.images.labels(image)
    check_labels(image, labels, expected_agent, explicit=explicit)
    assert labels is not None
    return labels


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What a bridge may start, decided against its runtime: the image and agent it expects, the
    packages the image holds, and whether starting sandboxes is refused (and why)."""

    image: str
    agent_hash: str | None
    packages: tuple[str, ...] = ()
    """``name==version`` of the image's requested packages (its ``kernelbridge.packages`` label)."""
    refusal: str | None = None
    """Why no sandbox may start now (limits not enforced and not allowed, no runtime, a wrong or
    missing image); None: they may."""
    unlimited: bool = False
    """The runtime ignores memory and pid limits and the operator allowed that."""
    final: bool = True
    """Whether this answer holds for the bridge's life; a missing image or a stopped daemon may be
    fixed while it runs, so such a policy is decided again at the next call."""


UNLIMITED_REFUSAL = (
    "sandboxes are refused on this host: its container runtime ({why}) ignores memory and process"
    " limits, so a sandbox could take all of the host's memory; the operator can run podman as root"
    " or on cgroup v2, or accept unlimited sandboxes with KERNELBRIDGE_ALLOW_UNLIMITED=1"
)


class LimitsNotEnforced(SandboxError):
    """The runtime ignores memory and pid limits and the operator did not allow that."""


async def preflight(
    settings: Settings, runtime: RuntimeBackend, image: str, agent: str | None
) -> tuple[dict[str, str], bool]:
    """Check what must hold before any sandbox starts: limits enforced (or allowed not to be) and
    the image a kernelbridge image with ``agent``. Returns (the image's labels, whether sandboxes
    run without limits). Raises LimitsNotEnforced, ImageError, RuntimeUnavailable (one line each)."""
    info = await runtime.info()
    if not info.limits_enforced and not settings.allow_unlimited:
        why = f"{'rootless ' if info.rootless else ''}{info.engine} on cgroups {info.cgroup_version or '?'}"
        raise LimitsNotEnforced(UNLIMITED_REFUSAL.format(why=why))
    if agent is None:
        labels = await runtime.images.labels(image) or {}
    else:
        labels = await verify_image(runtime, image, agent, explicit=bool(settings.image))
    return labels, not info.limits_enforced


async def sandbox_policy(settings: Settings, runtime: RuntimeBackend) -> SandboxPolicy:
    """Decide :class:`SandboxPolicy` for a bridge on ``runtime`` (never raises KernelBridgeError:
    what goes wrong becomes the refusal, one line)."""
    from kernelbridge.image import PACKAGES_LABEL, parse_packages

    try:
        image, agent = expected_image(settings)
    except KernelBridgeError as exc:
        return SandboxPolicy(settings.image or "?", None, refusal=str(exc))
    try:
        labels, unlimited = await preflight(settings, runtime, image, agent)
    except LimitsNotEnforced as exc:
        return SandboxPolicy(image, agent, refusal=str(exc))
    except KernelBridgeError as exc:
        # A stopped daemon or a missing image can be fixed while the bridge runs.
        return SandboxPolicy(image, agent, refusal=str(exc), final=False)
    packages = tuple(parse_packages(labels.get(PACKAGES_LABEL)))
    return SandboxPolicy(image, agent, packages, unlimited=unlimited)


class SandboxGate:
    """The bridge's :class:`SandboxPolicy`, decided at start and again while it is not final."""

    def __init__(self, settings: Settings, runtime: RuntimeBackend, policy: SandboxPolicy) -> None:
        self.settings = settings
        self.runtime = runtime
        self.policy = policy
        self._lock = anyio.Lock()

    @classmethod
    async def open(cls, settings: Settings, runtime: RuntimeBackend) -> SandboxGate:
        policy = await sandbox_policy(settings, runtime)
        if policy.refusal:
            log.warning("%s", policy.refusal)
        return cls(settings, runtime, policy)

    async def check(self) -> SandboxPolicy:
        """The policy, once it allows sandboxes. Raises SandboxError with the refusal otherwise."""
        if self.policy.refusal and not self.policy.final:
            async with self._lock:
                if self.policy.refusal and not self.policy.final:
                    self.policy = await sandbox_policy(self.settings, self.runtime)
        if self.policy.refusal:
            raise SandboxError(self.policy.refusal)
        return self.policy


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


@contextlib.asynccontextmanager
async def checked_container(
    settings: Settings, runtime: RuntimeBackend, spec: ContainerSpec, agent: str | None
) -> AsyncIterator[tuple[str, ContainerStream]]:
    """:func:`preflight`, then :func:`started_container` (for a tunnel process, which has no
    bridge to have checked before)."""
    await preflight(settings, runtime, spec.image, agent)
    async with started_container(runtime, spec) as started:
        yield started


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
        "allow_unlimited": settings.allow_unlimited,
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
