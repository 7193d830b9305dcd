"""Several engines behind one backend: each new sandbox goes to the least-loaded engine.

Load is the count of live kernelbridge containers (created or running, any bridge's) an engine
lists, plus the creations this bridge has placed there and not yet seen listed; ties go to the
engine listed first. A container stays on the engine that created it: :class:`EngineSet`
remembers each container's owner and routes every later call (attach, remove, inspect) to
it, and :meth:`EngineSet.place` hands out the chosen backend itself for callers that would
rather hold it.

An engine that does not answer is skipped for placement (with its reason kept for the error if
none answers); listing merges the engines that answer. Image chores go to every engine
(:class:`ImageSet`): a sandbox can only be placed where its image is.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    ImageInfo,
    ImageStore,
    RuntimeBackend,
    RuntimeInfo,
)

LIVE = (ContainerState.CREATED, ContainerState.RUNNING, ContainerState.PAUSED)


class EngineSet(RuntimeBackend):
    """Least-loaded placement over ``backends`` (in priority order). Owns and closes them."""

    def __init__(self, backends: builtins.list[RuntimeBackend]) -> None:
        if not backends:
            raise ValueError("an EngineSet needs at least one engine")
        self.backends = backends
        engines = {b.engine for b in backends}
        self.engine = engines.pop() if len(engines) == 1 else "mixed"
        self.name = "engines"
        self.images = ImageSet([b.images for b in backends])
        self._owner: dict[str, RuntimeBackend] = {}
        """Container id and name -> the backend that created it."""
        self._alias: dict[str, str] = {}
        """Container id -> name and name -> id, for the containers in ``_owner``."""
        self._placed: builtins.list[set[str]] = [set() for _ in backends]
        """Ids this bridge created on each engine and has not removed."""
        self._pending = [0] * len(backends)
        """Creations under way on each engine (no id yet)."""

    def __repr__(self) -> str:
        return f"<EngineSet {[getattr(b, 'name', '?') for b in self.backends]}>"

    async def loads(self) -> builtins.list[int | None]:
        """Each engine's load, None for one that did not answer."""
        seen: builtins.list[builtins.list[ContainerInfo] | None] = [None] * len(self.backends)

        async def count(i: int) -> None:
            try:
                seen[i] = await self.backends[i].list({SESSION_LABEL: ""})
            except RuntimeUnavailable:
                seen[i] = None

        async with anyio.create_task_group() as tg:
            for i in range(len(self.backends)):
                tg.start_soon(count, i)
        loads: builtins.list[int | None] = []
        for i, listed in enumerate(seen):
            if listed is None:
                loads.append(None)
                continue
            live = {c.id for c in listed if c.state in LIVE}
            # Ours that the listing may not show yet count too; the union counts each once.
            loads.append(len(live | self._placed[i]) + self._pending[i])
        return loads

    async def place(self) -> RuntimeBackend:
        """The least-loaded engine that answers (ties: the first listed).
        Raises RuntimeUnavailable when none answers."""
        return self.backends[await self._choose()]

    async def _choose(self) -> int:
        loads = await self.loads()
        candidates = [(load, i) for i, load in enumerate(loads) if load is not None]
        if not candidates:
            raise RuntimeUnavailable(f"none of the {len(self.backends)} engines answers")
        return min(candidates)[1]

    async def create(self, spec: ContainerSpec) -> str:
        index = await self._choose()
        # Counted before the first await of the creation, so that a concurrent placement sees it.
        self._pending[index] += 1
        try:
            backend = self.backends[index]
            container = await backend.create(spec)
        finally:
            self._pending[index] -= 1
        self._placed[index].add(container)
        self._owner[container] = self._owner[spec.name] = backend
        self._alias[container], self._alias[spec.name] = spec.name, container
        return container

    async def _backend_of(self, container: str) -> RuntimeBackend | None:
        known = self._owner.get(container)
        if known is not None:
            return known
        for backend in self.backends:  # created by an earlier bridge: ask around
            try:
                if await backend.inspect(container) is not None:
                    self._owner[container] = backend
                    return backend
            except RuntimeUnavailable:
                continue
        return None

    async def attach(self, container: str) -> ContainerStream:
        backend = await self._backend_of(container)
        if backend is None:
            raise RuntimeUnavailable(f"no engine has a container {container}")
        return await backend.attach(container)

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        backend = await self._backend_of(container)
        if backend is None:
            raise RuntimeUnavailable(f"no engine has a container {container}")
        return await backend.attach_exec(container, command, user=user, workdir=workdir, env=env)

    async def remove(self, containers: builtins.list[str]) -> None:
        mine: dict[int, builtins.list[str]] = {}
        unknown: builtins.list[str] = []
        for c in containers:
            owner = self._owner.get(c)
            if owner is None:
                unknown.append(c)
            else:
                mine.setdefault(self.backends.index(owner), []).append(c)

        failures: builtins.list[RuntimeUnavailable] = []

        async def remove_on(i: int, names: builtins.list[str]) -> None:
            try:
                await self.backends[i].remove(names)
            except RuntimeUnavailable as exc:  # the other engines' removals go on
                failures.append(exc)
                return
            self._placed[i].difference_update(names + [self._alias.get(n, "") for n in names])

        async with anyio.create_task_group() as tg:
            for i, names in mine.items():
                tg.start_soon(remove_on, i, names)
            if unknown:  # removal is idempotent: ask every engine
                for i in range(len(self.backends)):
                    tg.start_soon(remove_on, i, unknown)
        for c in containers:
            for key in (c, self._alias.get(c, "")):
                self._owner.pop(key, None)
                self._alias.pop(key, None)
        if failures:
            raise failures[0]

    async def inspect(self, container: str) -> ContainerInfo | None:
        backend = await self._backend_of(container)
        return None if backend is None else await backend.inspect(container)

    async def ended(self, container: str) -> ContainerInfo | None:
        for backend in self.backends:  # gone from every engine: the one that kept its death says
            if (info := await backend.ended(container)) is not None:
                return info
        return None

    async def list(self, labels: dict[str, str] | None = None) -> builtins.list[ContainerInfo]:
        found: builtins.list[ContainerInfo] = []

        async def list_on(backend: RuntimeBackend) -> None:
            try:
                found.extend(await backend.list(labels))
            except RuntimeUnavailable:
                pass

        async with anyio.create_task_group() as tg:
            for backend in self.backends:
                tg.start_soon(list_on, backend)
        return found

    async def info(self) -> RuntimeInfo:
        first = await self.backends[0].info()
        endpoints = []
        for backend in self.backends:
            endpoint = getattr(backend, "endpoint", None)
            endpoints.append(getattr(endpoint, "url", getattr(backend, "name", "?")))
        return RuntimeInfo(
            name=self.name,
            engine=self.engine,
            version=first.version,
            endpoint=", ".join(endpoints),
            rootless=first.rootless,
            cgroup_version=first.cgroup_version,
            oci_runtime=first.oci_runtime,
            limits_enforced=first.limits_enforced,
            storage_driver=first.storage_driver,
            reattach=first.reattach,
        )

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for backend in self.backends:
                await backend.aclose()


class ImageSet(ImageStore):
    """The images of several engines as one store: every change goes to every engine, in order
    (the first failure stops it, with that engine's message); an image is there when it is on
    every engine."""

    def __init__(self, stores: builtins.list[ImageStore]) -> None:
        self.stores = stores

    async def labels(self, image: str) -> dict[str, str] | None:
        """The image's labels (the first engine's) where every engine has it; None when one lacks it."""
        labels: dict[str, str] | None = None
        for store in self.stores:
            found = await store.labels(image)
            if found is None:
                return None
            labels = found if labels is None else labels
        return labels

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        for store in self.stores:
            await store.import_rootfs(tarball, tag, changes)

    async def tag(self, image: str, tag: str) -> None:
        for store in self.stores:
            await store.tag(image, tag)

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> builtins.list[ImageInfo]:
        """Every engine's images (an image on two engines is listed twice: ids differ per engine)."""
        found: builtins.list[ImageInfo] = []
        for store in self.stores:
            found += await store.list(repository, labels=labels)
        return found

    async def remove(self, image: str) -> bool:
        removed = True
        for store in self.stores:
            removed = await store.remove(image) and removed
        return removed

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: str = "Containerfile",
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        for store in self.stores:
            await store.build(context, tag, containerfile=containerfile, build_args=build_args)

    async def save(self, image: str, archive: Path) -> None:
        """The first engine's copy (every engine has the same image: they were built alike)."""
        await self.stores[0].save(image, archive)

    async def load(self, archive: Path) -> builtins.list[str]:
        """Into every engine; what the first said it loaded."""
        loaded = [await store.load(archive) for store in self.stores]
        return loaded[0]
