"""The host's package service: ``%pip install`` for sandboxes that have no network.

The ``packages_*`` rpc methods (docs/rpc.md, "Packages") of every sandbox of a bridge, or of one
kernelspec kernel's tunnel process, come here (:class:`WithPackages` routes them past the hub).
One install, driven by the sandbox: ``packages_install`` answers a **plan** (the wheels to send,
found and fetched by :class:`~.supply.WheelSupply`), ``packages_fetch`` one chunk of one of them at
a time, ``packages_done`` the install's **record**, which the session journals so that a restore
or a replay installs exactly those wheels again (:meth:`PackageService.prefer`). The caps per
sandbox and what counts against them: docs/architecture.md, "Packages and data". Every failure is
an :class:`~kernelbridge.errors.RpcError` with one line for the cell, quoting the sandbox's own
text, never a host path or URL.
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.config import Settings
from kernelbridge.errors import RpcError
from kernelbridge.packages.cache import CachedWheel, CacheError, WheelCache
from kernelbridge.packages.pip import pip_env
from kernelbridge.packages.record import InstallRecord, WheelRecord
from kernelbridge.packages.requirements import PackagePolicy, parse_environment, parse_requirements
from kernelbridge.packages.supply import WheelSupply, package_error

log = logging.getLogger(__name__)

CHUNK = 8 * 1024 * 1024
"""Bytes of a wheel per ``packages_fetch`` answer: about 11 MiB of base64, well inside an rpc
answer (32 MiB) and the agent's queue for the kernel (64 MiB), and few round trips for a big wheel."""
PLAN_TTL = 600.0
"""Seconds a plan may wait for its fetches and its ``done``; then its reservation is released."""
MAX_ERROR_CHARS = 2000
METHODS = frozenset({"packages_install", "packages_fetch", "packages_done"})


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
    holding: set[str] = field(default_factory=set)
    """sha256s of the cached wheels the install being planned has found so far."""


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
        self._supply = WheelSupply(self.cache, max_bytes=self.max_bytes, env=pip_env(env), held=self._held)
        self._sandboxes: dict[Key, SandboxPackages] = {}
        self._preferred: dict[tuple[str, str], list[InstallRecord]] = {}

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
                f"this session has asked for its {self.max_installs} installs, refused ones included"
                " (KERNELBRIDGE_PACKAGES_MAX_INSTALLS); nothing was installed",
            )
        left = self.max_bytes - state.installed_bytes
        if left <= 0:
            raise RpcError(
                "too_large",
                f"this session has installed its {_mib(self.max_bytes)} (KERNELBRIDGE_PACKAGES_MAX_BYTES);"
                " nothing was installed",
            )
        # Every install the host works on counts, a refused or failed one too: each costs the host
        # a resolution and downloads, and this cap is what bounds them per sandbox.
        state.installs += 1
        state.planning, state.plan = True, None
        try:
            resolved, source = await self._supply.resolve(
                todo, environment, upgrade=upgrade, preferred=state.preferred, left=left
            )
            # What the sandbox has at that very version stays as it is (constraints make that
            # every dependency but the ones asked for).
            needed = [r for r in resolved if environment.get(r.name) != r.version]
            wheels = await self._supply.gather(needed, left=left, holding=state.holding)
        finally:
            state.planning = False
            state.holding = set()
        if not wheels:  # the newest fitting versions are the ones the sandbox has
            have = [f"{r.name} {r.version}" for r in resolved if r.name in {w.name for w in todo}]
            return {"plan": None, "install": [], "satisfied": already + have, "source": source}
        plan = Plan(secrets.token_hex(8), [w.text for w in todo], {w.sha256: w for w in wheels}, source)
        state.plan = plan
        return {
            "plan": plan.id,
            "install": [_wheel_record(w) for w in wheels],
            "satisfied": already,
            "source": source,
            "chunk": CHUNK,
        }

    def _held(self) -> set[str]:
        """The sha256s of the wheels that installs in progress hold (no prune removes them)."""
        held: set[str] = set()
        now = time.monotonic()
        for state in self._sandboxes.values():
            held |= state.holding
            if state.plan is not None and now - state.plan.created <= PLAN_TTL:
                held |= set(state.plan.wheels)
        return held

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
