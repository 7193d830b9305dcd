"""A sandbox's container: its spec from the settings, and how a sandbox obtains it with its stream.

A :class:`ContainerSource` yields an :class:`AttachedContainer` (an id and its stdio stream): created
(:class:`NewContainer`, attached before it starts) or adopted (:class:`AdoptedContainer`, through the
exec'd :data:`HANDOVER_COMMAND`). When the sandbox is done the stream is closed and the container
removed, shielded and bounded, unless it was let go of (``keep_running``: a detached durable
sandbox). A durable container's labels name its state directory by a hash (:data:`STATE_LABEL`),
never by its path. Design: docs/design/host.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import SandboxStartTimeout
from kernelbridge.image.containerfile import AGENT_PREFIX
from kernelbridge.inside.handover import RELAY_UID
from kernelbridge.runtime import ContainerInfo, ContainerSpec, ContainerStream, RuntimeBackend
from kernelbridge.runtime.base import STATE_LABEL as STATE_LABEL
from kernelbridge.runtime.reaper import own_start

log = logging.getLogger(__name__)

# Why 20 s: removing a container takes ~0.3 s here; a busy engine can take seconds; past this
# the engine is wedged and the owner label lets the next start reap the container.
REMOVE_TIMEOUT = 20.0
CREATE_TIMEOUT = 60.0
"""Bound on creating a container (shielded: see started_container); a create takes ~0.1 s here."""
INSPECT_TIMEOUT = 5.0
"""Bound on asking the engine how a container ended (it only adds detail to the reason)."""

NAMESPACE_LABEL = "kernelbridge.namespace"
"""The HTTP client (token name) a sandbox serves; absent over stdio."""
HANDOVER_COMMAND = (
    "/usr/bin/python3",
    "-I",
    "-S",
    f"/{AGENT_PREFIX}/kernelbridge/inside/handover.py",
)
"""Run in a durable sandbox to reach it again (``kernelbridge/inside/handover.py``, whose
docstring says why each part): an isolated interpreter without site (nothing on ``sys.path`` the
sandbox can write, no ``PYTHON*`` variable heeded), on the image's read-only copy of the script
by its absolute path (never ``-m``, which would resolve it through ``sys.path``)."""
HANDOVER_USER = f"{RELAY_UID}:{RELAY_UID}"
"""A uid of its own, neither the kernel's nor root: kernel code (uid 65534) cannot ptrace the
handover, signal it or open its /proc entries, and it owns nothing (``handover.RELAY_UID``)."""
HANDOVER_WORKDIR = "/"
"""Not the container's working directory (/workspace, which kernel code writes)."""
HANDOVER_ENV = (("PATH", "/usr/bin:/bin"), ("LD_PRELOAD", ""), ("LD_LIBRARY_PATH", ""), ("LD_AUDIT", ""))
"""Set over the container's environment (an engine merges an exec's: it can override a variable,
not remove it). That environment is the bridge's (the image's ENV and the spec's), which kernel
code cannot change, and ``-I`` has Python ignore every ``PYTHON*`` variable in it; the loader's,
which act before Python starts, are emptied all the same."""


def state_identity(state_dir: Path) -> str:
    """A name for ``state_dir`` on this host that says nothing of its path: its label value."""
    where = f"{socket.gethostname()}:{os.path.realpath(state_dir)}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def container_spec(
    settings: Settings, session: str, image: str, *, agent_hash: str | None = None, durable: bool = False
) -> ContainerSpec:
    """The sandbox container of ``session``; its name carries a random suffix (a restart racing
    the old container's removal, or two bridges, would otherwise collide) and, over HTTP, the
    namespace of the client it serves (two clients may both call a session ``default``).
    ``durable``: it may outlive its bridge (labelled with the state directory's identity);
    ``agent_hash``: the agent expected in ``image`` (labelled: a later bridge checks it)."""
    prefix = f"kernelbridge-{settings.namespace}-" if settings.namespace else "kernelbridge-"
    labels = settings.labels
    if settings.namespace:
        labels = (*labels, (NAMESPACE_LABEL, settings.namespace))
    if durable:
        labels = (*labels, (STATE_LABEL, state_identity(settings.state_dir)))
    return ContainerSpec(
        image=image,
        name=f"{prefix}{session}-{secrets.token_hex(3)}",
        # The session label names the namespace too: two clients' "default" stay apart.
        session=f"{settings.namespace}/{session}" if settings.namespace else session,
        owner_pid=os.getpid(),
        owner_host=socket.gethostname(),
        owner_start=own_start(),
        limits=settings.limits,
        labels=labels,
        mounts=settings.mounts,
        agent_hash=agent_hash or "",
        durable=durable,
    )


@dataclass(slots=True)
class AttachedContainer:
    """A running sandbox container and its stdio stream, however they were obtained."""

    id: str
    name: str
    stream: ContainerStream
    runtime: RuntimeBackend | None = None
    """Where to ask how it ended (None: nowhere, e.g. a scripted stream in a test)."""
    keep_running: bool = False
    """Set by the sandbox when it let go of a durable container: not removed after the stream."""

    async def inspect(self) -> ContainerInfo | None:
        """What the engine knows of it now (exit code, OOM kill), or None; bounded, shielded
        from cancellation, never raises (it only adds detail to a reason)."""
        if self.runtime is None:
            return None
        with anyio.CancelScope(shield=True), anyio.move_on_after(INSPECT_TIMEOUT):
            try:
                # A durable container is removed by the engine as it ends (AutoRemove): its end
                # may then be known only from the engine's record of it.
                return await self.runtime.inspect(self.id) or await self.runtime.ended(self.id)
            except Exception:
                log.debug("inspecting %s failed", self.id, exc_info=True)
        return None


class ContainerSource(Protocol):
    """How a sandbox gets its container and stream."""

    @property
    def name(self) -> str:
        """The container's name (known before it exists)."""
        ...

    @property
    def label(self) -> str:
        """Its ``kernelbridge.session`` label: who it was started for (a session, or the warm
        pool); labels never change, so a session that took a warm sandbox keeps this name."""
        ...

    def open(self) -> AbstractAsyncContextManager[AttachedContainer]:
        """The container, attached, for the sandbox's life; released on exit. Raises ImageError,
        RuntimeUnavailable (from the runtime)."""
        ...


@dataclass(frozen=True, slots=True)
class NewContainer(ContainerSource):
    """A container created from ``spec`` for one sandbox's life, removed after it."""

    runtime: RuntimeBackend
    spec: ContainerSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return self.spec.session

    def open(self) -> AbstractAsyncContextManager[AttachedContainer]:
        return started_container(self.runtime, self.spec)


@dataclass(frozen=True, slots=True)
class AdoptedContainer(ContainerSource):
    """A durable sandbox's container that already runs, reached through an exec'd handover."""

    runtime: RuntimeBackend
    container_id: str
    container_name: str
    container_label: str

    @property
    def name(self) -> str:
        return self.container_name

    @property
    def label(self) -> str:
        return self.container_label

    def open(self) -> AbstractAsyncContextManager[AttachedContainer]:
        return adopted_container(self.runtime, self.container_id, self.container_name)


@contextlib.asynccontextmanager
async def started_container(runtime: RuntimeBackend, spec: ContainerSpec) -> AsyncIterator[AttachedContainer]:
    """Create and attach a container; on exit (or a failure half-way) close the stream and remove
    the container (unless let go of), shielded and bounded. Raises ImageError / RuntimeUnavailable
    from the runtime."""
    # The trap: a create cancelled half-way (the bridge closing while a warm sandbox starts) can
    # leave a container the engine made but whose id never came back, in `Created` for good. So
    # the create is shielded (bounded: past CREATE_TIMEOUT the name is removed instead), and a
    # cancellation that arrived meanwhile is delivered inside the try, whose finally removes it.
    with anyio.CancelScope(shield=True):
        try:
            with anyio.fail_after(CREATE_TIMEOUT):
                container = await runtime.create(spec)
        except TimeoutError:
            await _remove_quietly(runtime, spec.name)
            raise SandboxStartTimeout(
                f"the container engine did not create {spec.name} within {CREATE_TIMEOUT:g} s"
            ) from None
    attached: AttachedContainer | None = None
    try:
        await anyio.lowlevel.checkpoint()
        attached = AttachedContainer(container, spec.name, await runtime.attach(container), runtime)
        yield attached
    finally:
        await _release(runtime, container, spec.name, attached)


@contextlib.asynccontextmanager
async def adopted_container(
    runtime: RuntimeBackend, container: str, name: str
) -> AsyncIterator[AttachedContainer]:
    """Attach to a running durable sandbox through its handover; release it as
    :func:`started_container` does. Raises RuntimeUnavailable (it is gone, not running, or the
    engine refuses)."""
    stream = await runtime.attach_exec(
        container, HANDOVER_COMMAND, user=HANDOVER_USER, workdir=HANDOVER_WORKDIR, env=HANDOVER_ENV
    )
    attached = AttachedContainer(container, name, stream, runtime)
    try:
        yield attached
    finally:
        await _release(runtime, container, name, attached)


async def _release(
    runtime: RuntimeBackend, container: str, name: str, attached: AttachedContainer | None
) -> None:
    """Close the stream, then remove the container unless it was let go of (shielded, bounded)."""
    with anyio.CancelScope(shield=True):
        if attached is not None:
            with contextlib.suppress(Exception):
                await attached.stream.aclose()
            if attached.keep_running:
                return
        with anyio.move_on_after(REMOVE_TIMEOUT) as scope:
            try:
                await runtime.remove([container])
            except Exception as exc:
                log.warning("could not remove container %s: %s", name, exc)
        if scope.cancelled_caught:
            log.warning("removing container %s took over %.0f s; left for reaping", name, REMOVE_TIMEOUT)


async def _remove_quietly(runtime: RuntimeBackend, name: str) -> None:
    """Remove a container by name, bounded and shielded; whatever fails is logged only."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(REMOVE_TIMEOUT):
        try:
            await runtime.remove([name])
        except Exception as exc:
            log.warning("could not remove container %s: %s", name, exc)
