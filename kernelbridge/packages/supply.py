"""The wheels of one install brought onto the host, within its budgets: resolved, then fetched.

For one install :class:`WheelSupply` finds the wheels (a notebook's record, a stored resolution, or
the host's pip now: :mod:`.pip`), then fetches each missing one (:mod:`.fetch`) into the wheel cache
(:mod:`.cache`) only when it fits: no download, pip's during a resolution included, may take more
than the session may still install (``left``), nor more than the cache's budget has room for once
least recently used wheels are pruned. One pip run or fetch at a time per bridge, each in a work
directory of the cache. Failures are :class:`~kernelbridge.errors.RpcError`, one line each quoting
the sandbox's own requirement: ``too_large`` (a cap, saying which), ``package_error`` (no such
package, no wheel for the sandbox, a version conflict, the index unreachable), ``invalid_params``
(a record whose wheel cannot be named to pip).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
from packaging.utils import canonicalize_name

from kernelbridge.errors import RpcError
from kernelbridge.image.target import DESCRIPTION, PIP_TARGET_FLAGS
from kernelbridge.packages import fetch, pip
from kernelbridge.packages.cache import CachedWheel, CacheError, WheelCache, resolution_key
from kernelbridge.packages.record import InstallRecord
from kernelbridge.packages.requirements import Wanted, parse_requirements, render_pin

DOWNLOAD_TIMEOUT = 600.0
"""Bound on fetching the wheels of one install (hundreds of MB over a slow link)."""
RESOLVE_ROOM = 1024 * 1024
"""Room made in the cache for a resolution: pip writes its report there (a resolution of a
hundred distributions makes about 200 KB; from an index without PEP 658 metadata, whole wheels
too, up to what the session may still install and the cache has free). Making room for the
session's whole budget would prune wheels for nothing."""
PACKAGE_ERROR = "package_error"
SDIST_HINT = "add it to the sandbox image instead: `kernelbridge image build --with {name}`"


def package_error(message: str) -> RpcError:
    return RpcError(PACKAGE_ERROR, message)


class WheelSupply:
    """Resolves and fetches the wheels of installs (see the module docstring)."""

    def __init__(
        self, cache: WheelCache, *, max_bytes: int, env: Mapping[str, str], held: Callable[[], set[str]]
    ) -> None:
        """``env`` is pip's (:func:`.pip.pip_env`); ``held`` gives the sha256s of the wheels that
        installs in progress hold, which no prune may remove; ``max_bytes`` is the session's cap
        (KERNELBRIDGE_PACKAGES_MAX_BYTES), for messages."""
        self.cache = cache
        self.max_bytes = max_bytes
        self._env = env
        self._held = held
        self._pip = anyio.CapacityLimiter(1)

    def __repr__(self) -> str:
        return f"<WheelSupply {self.cache!r}>"

    async def resolve(
        self,
        todo: list[Wanted],
        environment: dict[str, str],
        *,
        upgrade: bool,
        preferred: list[InstallRecord],
        left: int,
    ) -> tuple[list[pip.Resolved], str]:
        """The wheels for ``todo`` and where they were found: recorded (``preferred``, a restore),
        cached, or resolved by pip now (which writes at most ``left`` bytes, what the session may
        still install). Raises RpcError."""
        requirements = [w.text for w in todo]
        recorded = _recorded(preferred, requirements)
        if recorded is not None:
            return recorded, "recorded"
        asked = {w.name for w in todo}
        constraints = {name: version for name, version in environment.items() if name not in asked}
        key = resolution_key(requirements, PIP_TARGET_FLAGS)
        if not upgrade:
            cached = await anyio.to_thread.run_sync(
                lambda: self.cache.resolution(key, constraints, asked, fresh=True)
            )
            if cached is not None:
                return cached, "cache"
        try:
            async with self._pip, self._work(left, prune_for=RESOLVE_ROOM) as (work, limit):
                try:
                    resolved = await pip.resolve(requirements, constraints, work, limit=limit, env=self._env)
                except pip.PipFailure as failure:
                    if failure.kind is pip.Failure.TOO_LARGE:
                        raise self._too_large(
                            "resolving this made the host's pip download more than"
                            f" {_mib(limit)} (the index serves no metadata files, PEP 658, so pip reads"
                            " whole wheels)",
                            limit,
                            left,
                        ) from None
                    raise
        except pip.PipFailure as failure:
            if failure.kind is pip.Failure.INDEX_DOWN:
                stale = await anyio.to_thread.run_sync(
                    lambda: self.cache.resolution(key, constraints, asked, fresh=False)
                )
                if stale is not None:
                    return stale, "cache, offline"
            raise await self._explain(failure, todo) from None
        await anyio.to_thread.run_sync(self.cache.store_resolution, key, resolved)
        return resolved, "index"

    async def _explain(self, failure: pip.PipFailure, todo: list[Wanted]) -> RpcError:
        """One line for the cell, quoting the sandbox's own requirement; for "not found", whether
        the project exists without a wheel for the sandbox (a source distribution only: it would
        have to be built, which never happens here)."""
        if failure.kind is not pip.Failure.NOT_FOUND or failure.name is None:
            return package_error(f"{failure.message}; nothing was installed")
        name = failure.name
        asked = next((w for w in todo if w.name == name), None)
        shown = asked.shown if asked is not None else name
        try:
            async with self._pip, self._work(pip.MAX_OUTPUT) as (work, _):
                versions = await pip.index_versions(name, work, env=self._env)
        except (pip.PipFailure, RpcError):
            versions = None
        if not versions:
            return package_error(f"no package {shown} on the host's index; nothing was installed")
        if asked is not None and not any(asked.allows(v) for v in versions):
            return package_error(
                f"no version of {name} matches {shown} on the host's index (it has"
                f" {', '.join(versions[:5])}{', ...' if len(versions) > 5 else ''}); nothing was installed"
            )
        return package_error(
            f"{shown} has no binary wheel for the sandbox ({DESCRIPTION}): only a source"
            " distribution (or wheels for other platforms), and kernelbridge never builds packages"
            f" on the host; {SDIST_HINT.format(name=name)}; nothing was installed"
        )

    async def gather(self, needed: list[pip.Resolved], *, left: int, holding: set[str]) -> list[CachedWheel]:
        """The cached wheels of ``needed``, fetching the missing ones one by one: before each, what
        the install takes so far (unpacked) is checked against ``left``, and the fetch may take
        only the rest, so the host never downloads more than the session may still install. Each
        wheel found is added to ``holding`` (no prune removes it). Raises RpcError."""
        found: dict[str, CachedWheel] = {}
        missing: list[pip.Resolved] = []
        for item in needed:
            wheel = await anyio.to_thread.run_sync(self._lookup, item)
            if wheel is None:
                missing.append(item)
            else:
                found[item.name] = wheel
                holding.add(wheel.sha256)
        taken = sum(wheel.installed_size for wheel in found.values())
        if taken > left:
            raise self._too_large(self._takes(found.values()), left, left)
        if missing:
            missing = await self._locate(missing, left)
            async with self._pip, fetch.open_client(self._env) as client:
                with anyio.move_on_after(DOWNLOAD_TIMEOUT) as deadline:
                    for item in missing:
                        wheel = await self._download(client, item, left - taken, left)
                        found[item.name] = wheel
                        holding.add(wheel.sha256)
                        taken += wheel.installed_size
                        if taken > left:
                            # It stays in the cache (checked): a session with room may use it.
                            raise self._too_large(self._takes(found.values()), left, left)
            if deadline.cancelled_caught:
                late = f"the host's downloads did not finish within {DOWNLOAD_TIMEOUT:g} s"
                raise package_error(f"{late}; nothing was installed")
            await anyio.to_thread.run_sync(self.cache.prune, self._held())
        return [found[item.name] for item in needed]

    async def _download(
        self, client: httpx2.AsyncClient, item: pip.Resolved, budget: int, left: int
    ) -> CachedWheel:
        """Fetch one wheel into the cache: refused on the index's word when it is larger than
        ``budget`` (what the install may still take) or than the cache has room for, and cut at
        that size when the index said none or said less than it sends. Raises RpcError."""
        what = f"{item.name} {item.version}"
        if budget <= 0:
            raise self._too_large(f"installing this takes more than {_mib(left)} before {what}", left, left)
        try:
            declared = await fetch.declared_size(client, item.url, name=what)
        except fetch.FetchFailure as failure:
            raise package_error(f"{failure.message}; nothing was installed") from None
        if declared is not None and declared > budget:
            raise self._too_large(f"{what}'s wheel is {_mib(declared)}", budget, budget)
        async with self._work(budget, prune_for=declared) as (work, limit):
            if declared is not None and declared > limit:
                raise self._too_large(f"{what}'s wheel is {_mib(declared)}", limit, budget)
            bound = limit if declared is None else declared
            try:
                await fetch.fetch(client, item.url, work / item.filename, limit=bound, name=what)
            except fetch.FetchFailure as failure:
                if failure.kind is fetch.Failure.TOO_LARGE:
                    raise self._too_large(failure.message, limit, budget) from None
                raise package_error(f"{failure.message}; nothing was installed") from None
            try:
                return await anyio.to_thread.run_sync(self.cache.add, work / item.filename, item)
            except CacheError as exc:
                raise package_error(f"{exc}; nothing was installed") from None

    async def _locate(self, missing: list[pip.Resolved], left: int) -> list[pip.Resolved]:
        """``missing`` with a URL each: a notebook's record names wheels, not where they are, so
        the host's index is asked for exactly those pins (no dependencies)."""
        unlocated = [item for item in missing if not item.url]
        if not unlocated:
            return missing
        pins = [render_pin(item.name, item.version) for item in unlocated]
        try:
            async with self._pip, self._work(left, prune_for=RESOLVE_ROOM) as (work, limit):
                located = await pip.resolve(pins, {}, work, limit=limit, no_deps=True, env=self._env)
        except pip.PipFailure as failure:
            raise package_error(f"{failure.message}; nothing was installed") from None
        by_name = {item.name: item for item in located}
        out = []
        for item in missing:
            there = by_name.get(canonicalize_name(item.name)) if not item.url else item
            if there is None or there.filename != item.filename:
                raise package_error(
                    f"the host's index no longer serves {item.filename}; nothing was installed"
                )
            out.append(item if item.url else dataclasses.replace(item, url=there.url))
        return out

    @asynccontextmanager
    async def _work(self, budget: int, *, prune_for: int | None = None) -> AsyncIterator[tuple[Path, int]]:
        """A work directory of the cache and its limit: ``budget``, or less when the cache's
        budget (KERNELBRIDGE_PACKAGES_CACHE) has less room. Least recently used wheels are pruned
        to make ``prune_for`` bytes of room (all of ``budget`` if None): what the work is known to
        need, not every byte it may take."""
        need = budget if prune_for is None else min(prune_for, budget)
        await anyio.to_thread.run_sync(self.cache.make_room, need, self._held())
        limit = min(budget, await anyio.to_thread.run_sync(self.cache.room))
        if limit <= 0:
            raise package_error(
                "the host's wheel cache (KERNELBRIDGE_PACKAGES_CACHE) is full with the wheels of"
                " installs in progress; try again shortly; nothing was installed"
            )
        work = await anyio.to_thread.run_sync(self.cache.claim, limit)
        try:
            yield work.path, limit
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(work.release)

    def _takes(self, wheels: Iterable[CachedWheel]) -> str:
        listed = list(wheels)
        biggest = max(listed, key=lambda w: w.installed_size)
        total = sum(w.installed_size for w in listed)
        return f"installing this takes {_mib(total)} ({biggest.name} alone {_mib(biggest.installed_size)})"

    def _too_large(self, what: str, limit: int, budget: int) -> RpcError:
        """``what`` (it took more than ``limit``) said against the cap that set ``limit``: the
        session's ``budget`` of KERNELBRIDGE_PACKAGES_MAX_BYTES, or the cache's room."""
        if limit < budget:
            where = (
                f"more than the host's wheel cache has room for, {_mib(limit)} of"
                f" {_mib(self.cache.max_bytes)} (KERNELBRIDGE_PACKAGES_CACHE)"
            )
        else:
            where = (
                f"over what this session may still install, {_mib(max(budget, 0))} of"
                f" {_mib(self.max_bytes)} (KERNELBRIDGE_PACKAGES_MAX_BYTES)"
            )
        return RpcError("too_large", f"{what}, {where}; nothing was installed")

    def _lookup(self, item: pip.Resolved) -> CachedWheel | None:
        if item.sha256:
            return self.cache.get(item.sha256)
        return self.cache.find(item.name, item.version)


def _recorded(records: list[InstallRecord], requirements: list[str]) -> list[pip.Resolved] | None:
    """The wheels a recorded install of the same requirements brought in (a restore or replay)."""
    for record in records:
        if record.ok and record.installed and _rendered(record.requirements) == sorted(requirements):
            return [
                pip.Resolved(wheel.name, wheel.version, wheel.filename, "", wheel.sha256, requested=False)
                for wheel in record.installed
            ]
    return None


def _rendered(requirements: tuple[str, ...]) -> list[str] | None:
    """A record's requirements as the host renders them now (older records kept packaging's own
    spelling), sorted; None when one no longer parses."""
    try:
        wanted = parse_requirements(list(requirements))
    except RpcError:
        return None
    return sorted(item.text for item in wanted)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
