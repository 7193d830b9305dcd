"""Who is attached to a durable sandbox pod: a ``coordination.k8s.io/v1`` Lease per pod.

The Lease is named after the pod and owned by it; its holder is the attached bridge (``host/pid``).
:meth:`Leases.hold` takes a Lease at once when it is free, this bridge's, expired, or held by a gone
bridge of this host; one held elsewhere is waited for, bounded by its duration, then taken over if
not renewed meanwhile, else the pod is refused (:class:`SandboxHeld`). Held Leases are renewed every
:data:`RENEW_EVERY` (:meth:`Leases.keep`) and released when the bridge lets go. Every write is
conditional on the ``resourceVersion`` read. Design: docs/design/runtime.md.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.kube.errors import ClusterRefused, is_status

log = logging.getLogger(__name__)

LEASE_DURATION = 15
"""Seconds a Lease holds without renewal: a dead bridge elsewhere delays adoption this long."""
RENEW_EVERY = 5.0
POLL = 1.0
"""While waiting for another bridge's Lease to expire, how often it is read again."""


class SandboxHeld(RuntimeUnavailable):
    """The pod's Lease is held by another live bridge."""


def identity() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def micro_time(when: float) -> str:
    """A ``MicroTime`` (the API server parses exactly six fraction digits)."""
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Holding:
    """A Lease as read: its holder, when it was last renewed and for how long it holds."""

    holder: str
    renewed: float | None
    duration: int
    version: str
    transitions: int

    @classmethod
    def of(cls, lease: dict[str, Any]) -> Holding:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            renewed=parse_time(spec.get("renewTime")),
            duration=int(spec.get("leaseDurationSeconds") or LEASE_DURATION),
            version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def expired(self, now: float) -> bool:
        return self.renewed is None or self.renewed + self.duration < now

    def holder_gone_here(self, host: str) -> bool:
        """The holder ran on this host and its process is gone (pids are reused; a reused one
        only makes us wait for the Lease to expire)."""
        where, _, pid = self.holder.rpartition("/")
        if where != host or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


@dataclass
class Leases:
    """The Leases of one namespace that this bridge holds (see the module docstring)."""

    api: Any
    """A ``kube.api.Api`` (raw JSON calls)."""
    namespace: str
    me: str = field(default_factory=identity)
    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Pod name -> the Lease as last written (its resourceVersion)."""

    def path(self, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        return f"{base}/{name}" if name else base

    def _spec(self, *, taken: bool, transitions: int) -> dict[str, Any]:
        now = micro_time(time.time())
        spec: dict[str, Any] = {
            "holderIdentity": self.me,
            "leaseDurationSeconds": LEASE_DURATION,
            "renewTime": now,
        }
        if taken:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = transitions
        return spec

    async def create(self, pod: dict[str, Any], labels: dict[str, str]) -> None:
        """The Lease of a pod this bridge just made, held by it."""
        meta = pod.get("metadata") or {}
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": meta["name"],
                "labels": labels,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
                ],
            },
            "spec": self._spec(taken=True, transitions=0),
        }
        self.held[meta["name"]] = await self.api.json("POST", self.path(), body, what="to create a Lease")

    async def hold(self, name: str) -> None:
        """Hold the Lease of pod ``name`` (module docstring). Raises SandboxHeld, or
        RuntimeUnavailable when the cluster does not answer; a pod without a Lease (made by a
        bridge before Leases) gets none."""
        deadline = time.monotonic() + LEASE_DURATION + RENEW_EVERY
        first: Holding | None = None
        while True:
            try:
                lease = await self.api.json("GET", self.path(name), what=f"to read the Lease of {name}")
            except ClusterRefused as exc:
                if exc.status == 404:
                    return
                raise
            seen = Holding.of(lease)
            first = first or seen
            host = socket.gethostname()
            now = time.time()
            if not seen.holder or seen.holder == self.me or seen.expired(now) or seen.holder_gone_here(host):
                if seen.holder and seen.holder != self.me:
                    log.warning(
                        "took over the Lease of sandbox %s from bridge %s (%s)",
                        name,
                        seen.holder,
                        "its process is gone" if not seen.expired(now) else "it stopped renewing it",
                    )
                if await self._take(name, lease, seen):
                    return
                continue  # someone wrote it meanwhile: read again
            if seen.renewed != first.renewed or seen.holder != first.holder:
                raise SandboxHeld(f"sandbox {name} is held by bridge {seen.holder}, which renews its Lease")
            if time.monotonic() > deadline:
                raise SandboxHeld(
                    f"sandbox {name} is held by bridge {seen.holder} (its Lease did not expire)"
                )
            await anyio.sleep(POLL)

    async def _take(self, name: str, lease: dict[str, Any], seen: Holding) -> bool:
        transitions = seen.transitions + (seen.holder != self.me)
        patch = {
            "metadata": {"resourceVersion": seen.version},
            "spec": self._spec(taken=seen.holder != self.me, transitions=transitions),
        }
        try:
            self.held[name] = await self.api.json(
                "PATCH", self.path(name), patch, merge=True, what=f"to take the Lease of {name}"
            )
        except ClusterRefused as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def release(self, name: str) -> None:
        """Let go of pod ``name``'s Lease (its holder cleared, so the next bridge takes it at once)."""
        lease = self.held.pop(name, None)
        if lease is None:
            return
        version = (lease.get("metadata") or {}).get("resourceVersion")
        patch = {
            "metadata": {"resourceVersion": version},
            "spec": {"holderIdentity": None, "renewTime": None},
        }
        try:
            await self.api.json(
                "PATCH", self.path(name), patch, merge=True, what=f"to release the Lease of {name}"
            )
        except RuntimeUnavailable as exc:
            if not is_status(exc, 404, 409):  # gone with its pod, or taken by another bridge
                log.info("releasing the Lease of %s failed: %s", name, exc)

    def forget(self, name: str) -> None:
        self.held.pop(name, None)

    async def renew(self) -> None:
        """Renew every Lease held, each bounded; one that another bridge took is dropped."""
        for name, lease in list(self.held.items()):
            version = (lease.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": version}, "spec": {"renewTime": micro_time(time.time())}}
            try:
                written = await self.api.json(
                    "PATCH", self.path(name), patch, merge=True, what=f"to renew the Lease of {name}"
                )
            except RuntimeUnavailable as exc:
                if is_status(exc, 404, 409) and name in self.held:
                    log.warning("sandbox %s: its Lease is gone or another bridge took it", name)
                    self.held.pop(name, None)
                continue
            if name in self.held:
                self.held[name] = written

    async def keep(self) -> None:
        """Renew the held Leases every :data:`RENEW_EVERY` seconds, for ever (a runtime's task)."""
        while True:
            await anyio.sleep(RENEW_EVERY)
            await self.renew()
