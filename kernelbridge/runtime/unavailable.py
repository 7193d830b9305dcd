"""A stand-in for a container runtime that cannot be used (podman and docker missing or broken).

The server keeps answering ``tools/list`` and its resources without one; every operation that
needs a sandbox raises :class:`~kernelbridge.errors.RuntimeUnavailable` with the reason found at
start-up (which says what to install), so each call fails with that one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    ContainerInfo,
    ContainerSpec,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)


@dataclass
class UnavailableRuntime(RuntimeBackend):
    """Refuses everything with ``reason``; lists nothing."""

    reason: str
    name: str = "unavailable"
    engine: str = "none"

    def _refuse(self) -> RuntimeUnavailable:
        return RuntimeUnavailable(self.reason)

    async def create(self, spec: ContainerSpec) -> str:
        raise self._refuse()

    async def attach(self, container: str) -> ContainerStream:
        raise self._refuse()

    async def stop(self, container: str, timeout: float = 0) -> None:
        return None

    async def remove(self, containers: list[str]) -> None:
        return None

    async def inspect(self, container: str) -> ContainerInfo | None:
        return None

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        return []

    async def info(self) -> RuntimeInfo:
        raise self._refuse()

    async def image_labels(self, image: str) -> dict[str, str] | None:
        raise self._refuse()

    async def import_image(self, tarball: Path, tag: str, changes: list[str]) -> None:
        raise self._refuse()

    async def tag_image(self, image: str, tag: str) -> None:
        raise self._refuse()

    async def list_images(self, repository: str) -> list[str]:
        raise self._refuse()

    async def remove_image(self, image: str) -> bool:
        raise self._refuse()

    async def aclose(self) -> None:
        return None
