"""The container runtime seam: what a sandbox needs from podman or docker, and nothing else.

A backend turns a :class:`ContainerSpec` into the argv of an interactive ``run`` whose stdin and
stdout become the frame tunnel, lists containers by label, and removes them. Only this package
branches on runtime names; everything above talks to :class:`RuntimeBackend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kernelbridge.config import SandboxLimits

SESSION_LABEL = "kernelbridge.session"
OWNER_LABEL = "kernelbridge.owner"
"""Label holding the pid of the bridge process that owns the container: used to find orphans."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Everything needed to start one sandbox container."""

    image: str
    name: str
    session: str
    owner_pid: int
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env: tuple[tuple[str, str], ...] = ()
    """Extra variables for the kernel; nothing of the host's environment enters by default."""
    command: tuple[str, ...] = ()
    """Overrides the image's CMD (the agent) when not empty."""


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container as listed by the runtime."""

    id: str
    name: str
    labels: dict[str, str]
    state: str

    @property
    def owner_pid(self) -> int | None:
        raw = self.labels.get(OWNER_LABEL, "")
        return int(raw) if raw.isdigit() else None


class RuntimeBackend(Protocol):
    """A container runtime driven through its command-line client."""

    name: str
    """``podman`` or ``docker``."""
    executable: str
    """Absolute path of the client binary."""

    def run_argv(self, spec: ContainerSpec) -> list[str]:
        """argv of a foreground, interactive (``-i``), self-removing (``--rm``) run of ``spec``."""
        ...

    async def list_containers(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        """Containers (running or not) carrying all of ``labels``. Raises RuntimeUnavailable."""
        ...

    async def remove(self, names: list[str]) -> None:
        """Force-remove containers; names that do not exist are ignored."""
        ...

    async def version(self) -> str:
        """The runtime's version string. Raises RuntimeUnavailable if the runtime does not answer."""
        ...

    async def info(self, template: str) -> str:
        """The runtime's ``info`` rendered with a Go template. Raises RuntimeUnavailable."""
        ...
