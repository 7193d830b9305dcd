"""A stand-in for a container runtime that cannot be used (podman and docker missing or broken).

The server keeps answering ``tools/list`` and its resources without one; every operation that
needs a sandbox or an image raises :class:`~kernelbridge.errors.RuntimeUnavailable` with the
reason found at start-up (which says what to install), so each call fails with that one line.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    ContainerInfo,
    ContainerSpec,
    ContainerStream,
    ImageInfo,
    ImageStore,
    RuntimeBackend,
    RuntimeInfo,
)


@dataclass
class UnavailableImages(ImageStore):
    """Refuses every image chore with ``reason``."""

    reason: str

    async def labels(self, image: str) -> dict[str, str] | None:
        raise RuntimeUnavailable(self.reason)

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        raise RuntimeUnavailable(self.reason)

    async def tag(self, image: str, tag: str) -> None:
        raise RuntimeUnavailable(self.reason)

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> list[ImageInfo]:
        raise RuntimeUnavailable(self.reason)

    async def remove(self, image: str) -> bool:
        raise RuntimeUnavailable(self.reason)

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: str = "Containerfile",
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        raise RuntimeUnavailable(self.reason)

    async def save(self, image: str, archive: Path) -> None:
        raise RuntimeUnavailable(self.reason)

    async def load(self, archive: Path) -> builtins.list[str]:
        raise RuntimeUnavailable(self.reason)


@dataclass
class UnavailableRuntime(RuntimeBackend):
    """Refuses everything with ``reason`` (an inspection too: nothing can be said of a container);
    lists nothing, removes nothing."""

    reason: str
    name: str = "unavailable"
    engine: str = "none"
    images: ImageStore = field(init=False)

    def __post_init__(self) -> None:
        self.images = UnavailableImages(self.reason)

    async def create(self, spec: ContainerSpec) -> str:
        raise RuntimeUnavailable(self.reason)

    async def attach(self, container: str) -> ContainerStream:
        raise RuntimeUnavailable(self.reason)

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        raise RuntimeUnavailable(self.reason)

    async def remove(self, containers: list[str]) -> None:
        return None

    async def inspect(self, container: str) -> ContainerInfo | None:
        # Not None: that would say the container is gone, and a durable session would be
        # ended lost while its sandbox may run on behind an engine that is only down.
        raise RuntimeUnavailable(self.reason)

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        return []

    async def ended(self, container: str) -> ContainerInfo | None:
        return None

    async def info(self) -> RuntimeInfo:
        raise RuntimeUnavailable(self.reason)

    async def aclose(self) -> None:
        return None
