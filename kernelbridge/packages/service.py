"""The host's package service: ``%pip install`` for sandboxes that have no network.

The rpc methods ``packages_*`` (docs/rpc.md, "Packages") of every sandbox of a bridge (or of one
kernelspec kernel's tunnel process) come here; :class:`WithPackages` routes them past the hub. One
install is three steps, driven by the sandbox (``inside/pythonpath/mcp/_packages.py``):

1. ``packages_install {requirements, environment, upgrade}``: the requirements are parsed and
   checked against the policy (:mod:`.requirements`); those the sandbox already satisfies are
   said so; the rest are resolved for the sandbox's platform with the sandbox's installed
   distributions as constraints (so no second numpy comes unless asked), from the cache of
   resolutions or by the host's pip; missing wheels are downloaded into the wheel cache and
   verified (:mod:`.cache`); the caps are checked. The answer is a **plan**: the wheels to send,
   each with its sha256 and sizes. Nothing is in the sandbox yet.
2. ``packages_fetch {plan, sha256, offset}``: one chunk (:data:`CHUNK`) of one wheel of that plan,
   base64. Pulled by the sandbox one at a time (one fetch in flight per sandbox): the wheel
   crosses the tunnel bounded, and neither side ever holds more than a chunk of it.
3. ``packages_done {plan, ok, error}``: the sandbox installed all of it (or none: it installs into
   a staging directory and moves it in only once everything unpacked). The answer is the install's
   **record** (requirements and exact wheels), which the session journals in the cell's metadata
   (``kernelbridge.packages``), so that restore and replay install exactly those wheels again,
   from the cache when they are there (:meth:`PackageService.prefer`).

Per sandbox (a session's name and container; a sandbox replaced after it died starts afresh, its
/packages tmpfs gone with the container): at most ``KERNELBRIDGE_PACKAGES_MAX_INSTALLS`` installs
and ``KERNELBRIDGE_PACKAGES_MAX_BYTES`` installed (counted unpacked, checked before any wheel
leaves the host: a wheel over the cap is refused whole), one install planned at a time. Bridge-wide,
one pip runs at a time (it is CPU-heavy and the machine has few cores).

Every failure is an :class:`~kernelbridge.errors.RpcError` with one line for the cell: ``denied``
(policy, the installs cap), ``too_large`` (the bytes cap), ``invalid_params`` (a requirement
refused), ``busy``, ``package_error`` (no such package, no wheel for the sandbox, a version conflict,
the index unreachable). Messages never name a host path.
"""

from __future__ import annotations

import base64
import logging
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from packaging.utils import canonicalize_name

from kernelbridge.config import Settings
from kernelbridge.errors import RpcError
from kernelbridge.hub.rpc import RpcCall, RpcHandler
from kernelbridge.image.target import DESCRIPTION, PIP_TARGET_FLAGS
from kernelbridge.packages import pip
from kernelbridge.packages.cache import CachedWheel, CacheError, WheelCache, resolution_key
from kernelbridge.packages.record import InstallRecord, WheelRecord
from kernelbridge.packages.requirements import PackagePolicy, Wanted, parse_environment, parse_requirements

log = logging.getLogger(__name__)

CHUNK = 8 * 1024 * 1024
"""Bytes of a wheel per ``packages_fetch`` answer: about 11 MiB of base64, well inside an rpc
answer (32 MiB) and the agent's queue for the kernel (64 MiB), and few round trips for a big wheel."""
PLAN_TTL = 600.0
"""Seconds a plan may wait for its fetches and its ``done``; then its reservation is released."""
MAX_ERROR_CHARS = 2000
METHODS = frozenset({"packages_install", "packages_fetch", "packages_done"})
PACKAGE_ERROR = "package_error"
SDIST_HINT = "add it to the sandbox image instead: `kernelbridge image build --with {name}`"


def package_error(message: str) -> RpcError:
    return RpcError(PACKAGE_ERROR, message)


@dataclass(slots=True)
class Plan:
    """What one ``packages_install`` sends to the sandbox."""

    id: str
    requirements: list[str]
    wheels: dict[str, CachedWheel]
    """By sha256."""
    source: str = ""
    created: float = field(default_factory=time.monotonic)

    @property
    def installed_bytes(self) -> int:
        return sum(wheel.installed_size for wheel in self.wheels.values())


@dataclass(slots=True)
class SandboxPackages:
    """What the service keeps for one sandbox."""

    installs: int = 0
    installed_bytes: int = 0
    installed: dict[str, CachedWheel] = field(default_factory=dict)
    """By name: what this sandbox installed (and said so)."""
    plan: Plan | None = None
    planning: bool = False
    fetching: bool = False
    preferred: list[InstallRecord] = field(default_factory=list)
    """Install records of a notebook being restored or replayed into this session."""


Key = tuple[str, str, str]
"""(namespace, session, sandbox)."""


class PackageService(RpcHandler):
    """Resolves, caches and hands out wheels for every sandbox of one bridge (or tunnel process)."""

    def __init__(self, settings: Settings, *, env: Mapping[str, str] | None = None) -> None:
        packages = settings.packages
        self.policy = PackagePolicy(
            "names" if packages.allowed else packages.policy, frozenset(packages.allowed)
        )
        self.max_bytes = packages.max_bytes
        self.max_installs = packages.max_installs
        self.cache = WheelCache(settings.packages_dir, packages.cache_bytes)
        self._env = pip.pip_env(env)
        self._sandboxes: dict[Key, SandboxPackages] = {}
        self._preferred: dict[tuple[str, str], list[InstallRecord]] = {}
        self._pip = anyio.CapacityLimiter(1)

    def __repr__(self) -> str:
        return f"<PackageService {self.policy.mode} sandboxes={len(self._sandboxes)}>"

    # -- for the session layer --------------------------------------------------------------------
    def prefer(self, namespace: str, session: str, records: list[InstallRecord]) -> None:
        """Install what ``records`` (a notebook's ``kernelbridge.packages`` records) name, exactly,
        when the same requirements are asked for again in ``session`` (a restore, a replay)."""
        for key, state in self._sandboxes.items():
            if key[:2] == (namespace, session):
                state.preferred = list(records)
        self._preferred[(namespace, session)] = list(records)

    def forget(self, namespace: str, session: str) -> None:
        """The session closed: drop what was kept for its sandboxes."""
        for key in [key for key in self._sandboxes if key[:2] == (namespace, session)]:
            del self._sandboxes[key]
        self._preferred.pop((namespace, session), None)

    def _state(self, call: RpcCall) -> SandboxPackages:
        key = (call.namespace, call.session, call.sandbox)
        state = self._sandboxes.get(key)
        if state is None:
            state = self._sandboxes[key] = SandboxPackages()
            state.preferred = list(self._preferred.get(key[:2], []))
        return state

    # -- dispatch ---------------------------------------------------------------------------------
    async def dispatch(self, call: RpcCall) -> object:
        """Answer one ``packages_*`` request. Raises RpcError only."""
        if not isinstance(call.params, dict):
            raise RpcError("invalid_params", "params must be a JSON object")
        try:
            if call.method == "packages_install":
                return await self._install(call, call.params)
            if call.method == "packages_fetch":
                return await self._fetch(call, call.params)
            if call.method == "packages_done":
                return self._done(call, call.params)
        except RpcError:
            raise
        except Exception:
            log.exception("packages: %s from session %r failed", str(call.method)[:40], call.session)
            raise RpcError("internal", "internal error in kernelbridge's package service (logged)") from None
        raise RpcError("invalid_params", f"unknown method {str(call.method)[:60]!r}")

    # -- install: plan ----------------------------------------------------------------------------
    async def _install(self, call: RpcCall, params: dict[str, Any]) -> object:
        _only(params, {"requirements", "environment", "upgrade"}, "packages_install")
        wanted = parse_requirements(params.get("requirements"))
        environment = parse_environment(params.get("environment", []))
        upgrade = params.get("upgrade", False)
        if not isinstance(upgrade, bool):
            raise RpcError("invalid_params", "packages_install: 'upgrade' must be true or false")
        self.policy.check(wanted)
        state = self._state(call)
        if state.planning:
            raise RpcError("busy", "another install is running in this session; wait for it")
        satisfied = {
            w.name for w in wanted if not upgrade and w.name in environment and w.allows(environment[w.name])
        }
        todo = [w for w in wanted if w.name not in satisfied]
        already = [f"{name} {environment[name]}" for name in sorted(satisfied)]
        if not todo:
            return {"plan": None, "install": [], "satisfied": already, "source": "sandbox"}
        if state.installs >= self.max_installs:
            raise RpcError(
                "denied",
                f"this session has made its {self.max_installs} installs"
                " (KERNELBRIDGE_PACKAGES_MAX_INSTALLS); nothing was installed",
            )
        state.planning, state.plan = True, None
        try:
            resolved, source = await self._resolve(todo, environment, upgrade, state)
            # What the sandbox has at that very version stays as it is (constraints make that
            # every dependency but the ones asked for).
            needed = [r for r in resolved if environment.get(r.name) != r.version]
            wheels = await self._ensure_cached(needed)
        finally:
            state.planning = False
        if not wheels:  # the newest fitting versions are the ones the sandbox has
            have = [f"{r.name} {r.version}" for r in resolved if r.name in {w.name for w in todo}]
            return {"plan": None, "install": [], "satisfied": already + have, "source": source}
        plan = Plan(secrets.token_hex(8), [w.text for w in todo], {w.sha256: w for w in wheels}, source)
        left = self.max_bytes - state.installed_bytes
        if plan.installed_bytes > left:
            biggest = max(wheels, key=lambda w: w.installed_size)
            raise RpcError(
                "too_large",
                f"installing this takes {_mib(plan.installed_bytes)} ({biggest.name} alone"
                f" {_mib(biggest.installed_size)}), over what this session may still install,"
                f" {_mib(max(left, 0))} of {_mib(self.max_bytes)} (KERNELBRIDGE_PACKAGES_MAX_BYTES);"
                " nothing was installed",
            )
        state.installs += 1
        state.plan = plan
        return {
            "plan": plan.id,
            "install": [_wheel_record(w) for w in wheels],
            "satisfied": already,
            "source": source,
            "chunk": CHUNK,
        }

    async def _resolve(
        self, todo: list[Wanted], environment: dict[str, str], upgrade: bool, state: SandboxPackages
    ) -> tuple[list[pip.Resolved], str]:
        """The wheels for ``todo``: recorded (a restore), cached, or resolved by pip now."""
        requirements = [w.text for w in todo]
        recorded = _recorded(state.preferred, requirements)
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
        work = await anyio.to_thread.run_sync(self.cache.download_dir)
        try:
            async with self._pip:
                resolved = await pip.resolve(requirements, constraints, work, env=self._env)
        except pip.PipFailure as failure:
            if failure.kind is pip.Failure.INDEX_DOWN:
                stale = await anyio.to_thread.run_sync(
                    lambda: self.cache.resolution(key, constraints, asked, fresh=False)
                )
                if stale is not None:
                    return stale, "cache, offline"
            raise await self._explain(failure, todo) from None
        finally:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(work, ignore_errors=True))
        await anyio.to_thread.run_sync(self.cache.store_resolution, key, resolved)
        return resolved, "index"

    async def _explain(self, failure: pip.PipFailure, todo: list[Wanted]) -> RpcError:
        """One line for the cell; for "not found", whether the project exists without a wheel for
        the sandbox (a source distribution only: it would have to be built, which never happens here)."""
        if failure.kind is not pip.Failure.NOT_FOUND:
            return package_error(f"{failure.message}; nothing was installed")
        shown = failure.name or "it"
        name = match.group(0) if (match := re.match(r"[A-Za-z0-9._-]+", shown)) else shown
        async with self._pip:
            try:
                versions = await pip.index_versions(name, env=self._env)
            except pip.PipFailure:
                versions = None
        if not versions:
            return package_error(f"no package {shown} on the host's index; nothing was installed")
        asked = next((w for w in todo if w.name == canonicalize_name(name)), None)
        if asked is not None and not any(asked.allows(v) for v in versions):
            return package_error(
                f"no version of {name} matches {asked.text} on the host's index (it has"
                f" {', '.join(versions[:5])}{', ...' if len(versions) > 5 else ''}); nothing was installed"
            )
        return package_error(
            f"{shown} has no binary wheel for the sandbox ({DESCRIPTION}): only a source"
            " distribution (or wheels for other platforms), and kernelbridge never builds packages"
            f" on the host; {SDIST_HINT.format(name=name)}; nothing was installed"
        )

    async def _ensure_cached(self, needed: list[pip.Resolved]) -> list[CachedWheel]:
        """The cached wheels of ``needed``, downloading (and verifying) the missing ones."""
        found: dict[str, CachedWheel] = {}
        missing: list[pip.Resolved] = []
        for item in needed:
            wheel = await anyio.to_thread.run_sync(self._lookup, item)
            if wheel is None:
                missing.append(item)
            else:
                found[item.name] = wheel
        if missing:
            dest = await anyio.to_thread.run_sync(self.cache.download_dir)
            try:
                async with self._pip:
                    await pip.download(missing, dest, env=self._env)
                for item in missing:
                    try:
                        found[item.name] = await anyio.to_thread.run_sync(
                            self.cache.add, dest / item.filename, item
                        )
                    except FileNotFoundError:
                        raise package_error(
                            f"the host's index did not serve {item.filename}; nothing was installed"
                        ) from None
                    except CacheError as exc:
                        raise package_error(f"{exc}; nothing was installed") from None
            except pip.PipFailure as failure:
                raise package_error(f"{failure.message}; nothing was installed") from None
            finally:
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(dest, ignore_errors=True))
            await anyio.to_thread.run_sync(self.cache.prune)
        return [found[item.name] for item in needed]

    def _lookup(self, item: pip.Resolved) -> CachedWheel | None:
        if item.sha256:
            return self.cache.get(item.sha256)
        return self.cache.find(item.name, item.version)

    # -- fetch and done ---------------------------------------------------------------------------
    def _plan(self, state: SandboxPackages, plan_id: object) -> Plan:
        plan = state.plan
        if plan is None or plan.id != plan_id or time.monotonic() - plan.created > PLAN_TTL:
            raise RpcError("invalid_params", "no such install in progress (it ended, or it timed out)")
        return plan

    async def _fetch(self, call: RpcCall, params: dict[str, Any]) -> object:
        _only(params, {"plan", "sha256", "offset"}, "packages_fetch")
        state = self._state(call)
        plan = self._plan(state, params.get("plan"))
        wheel = plan.wheels.get(params.get("sha256"))  # type: ignore[arg-type]
        offset = params.get("offset")
        if wheel is None:
            raise RpcError("invalid_params", "that wheel is not part of this install")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= wheel.size:
            raise RpcError("invalid_params", "offset must be an integer within the wheel")
        if state.fetching:
            raise RpcError("busy", "one chunk at a time: the previous fetch is still being answered")
        state.fetching = True
        try:
            data = await anyio.to_thread.run_sync(self.cache.read, wheel.sha256, offset, CHUNK)
        except CacheError as exc:
            raise package_error(str(exc)) from None
        finally:
            state.fetching = False
        return {
            "sha256": wheel.sha256,
            "offset": offset,
            "size": wheel.size,
            "data": base64.b64encode(data).decode("ascii"),
        }

    def _done(self, call: RpcCall, params: dict[str, Any]) -> object:
        _only(params, {"plan", "ok", "error"}, "packages_done")
        state = self._state(call)
        plan = self._plan(state, params.get("plan"))
        ok = params.get("ok") is True
        state.plan = None
        if ok:
            for wheel in plan.wheels.values():
                state.installed[wheel.name] = wheel
            state.installed_bytes += plan.installed_bytes
            wheels = tuple(WheelRecord(**_wheel_record(w)) for w in plan.wheels.values())
            return InstallRecord(tuple(plan.requirements), wheels, source=plan.source).to_json()
        error = params.get("error")
        why = str(error)[:MAX_ERROR_CHARS] if error else "the sandbox did not install it"
        return InstallRecord(tuple(plan.requirements), ok=False, error=why, source=plan.source).to_json()


def _only(params: dict[str, Any], allowed: set[str], method: str) -> None:
    unexpected = [key for key in params if key not in allowed]
    if unexpected:
        raise RpcError("invalid_params", f"{method}: unexpected parameter {str(unexpected[0])[:60]!r}")


def _wheel_record(wheel: CachedWheel) -> dict[str, Any]:
    return {
        "name": wheel.name,
        "version": wheel.version,
        "filename": wheel.filename,
        "sha256": wheel.sha256,
        "size": wheel.size,
        "installed_size": wheel.installed_size,
    }


def _recorded(records: list[InstallRecord], requirements: list[str]) -> list[pip.Resolved] | None:
    """The wheels a recorded install of the same requirements brought in (a restore or replay)."""
    for record in records:
        if record.ok and record.installed and sorted(record.requirements) == sorted(requirements):
            return [
                pip.Resolved(wheel.name, wheel.version, wheel.filename, "", wheel.sha256, requested=False)
                for wheel in record.installed
            ]
    return None


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


class WithPackages(RpcHandler):
    """An rpc handler that answers ``packages_*`` with the package service and everything else
    with ``other`` (the hub, a replay's recorded tools, or the no-hub refusal)."""

    def __init__(self, packages: PackageService, other: RpcHandler) -> None:
        self.packages = packages
        self.other = other

    async def dispatch(self, call: RpcCall) -> object:
        if call.method in METHODS:
            return await self.packages.dispatch(call)
        return await self.other.dispatch(call)
