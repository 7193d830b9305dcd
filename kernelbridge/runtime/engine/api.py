"""The Docker Engine API backend's containers: dockerd or ``podman system service``, local or remote.

One :class:`EngineRuntime` per engine holds ONE connection pool (``transport``) that every sandbox's
calls and its images share; attaching hijacks a connection of that pool, so no client process runs
per sandbox. Both engines are spoken to through the compat API at ``transport.API_VERSION``. Errors
are translated here: a missing image is ImageError, anything else RuntimeUnavailable in one line
naming the engine and its endpoint. Design: docs/design/runtime.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import anyio

from kernelbridge.errors import EngineRefused, ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import (
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.engine.body import create_body
from kernelbridge.runtime.engine.endpoint import Endpoint
from kernelbridge.runtime.engine.images import EngineImages, no_such
from kernelbridge.runtime.engine.service import HelperProcess
from kernelbridge.runtime.engine.stream import EngineStream
from kernelbridge.runtime.engine.transport import EngineClient, EngineResponse
from kernelbridge.runtime.events import died
from kernelbridge.runtime.flags import sandbox_flags, unsupported
from kernelbridge.runtime.info_store import InfoCache, InfoStore
from kernelbridge.runtime.races import half_removed, process_ended, retrying

log = logging.getLogger(__name__)

REMOVE_ATTEMPTS = 5
REMOVE_RETRY_DELAY = 0.2
"""A container that is stopping on its own, or that another client is removing, cannot be
removed for a moment ("removal already in progress", podman's "container state improper");
once stopped it can, and once the other client is done it is gone. Doubled at each attempt."""
EVENTS_TIMEOUT = 5.0
"""Bound of asking an engine's event log how a removed container ended: podman reads its whole
events file for it (tens of ms here); what it adds is detail, so a slow one is not waited for."""

_STATES = {
    "created": ContainerState.CREATED,
    "configured": ContainerState.CREATED,  # podman: created, not yet initialised
    "initialized": ContainerState.CREATED,  # podman: runtime container made, process not started
    "running": ContainerState.RUNNING,
    "paused": ContainerState.PAUSED,
    "restarting": ContainerState.RUNNING,
    "exited": ContainerState.EXITED,
    "stopped": ContainerState.EXITED,  # podman
    "dead": ContainerState.EXITED,
    "stopping": ContainerState.STOPPING,  # podman
    "removing": ContainerState.REMOVING,
}
PODMAN_HEADER = "libpod-api-version"
"""Set by podman on every answer to ``/_ping`` (docker sets ``Api-Version`` only)."""
SIGKILLED = 128 + 9


class EngineRuntime(RuntimeBackend):
    """A container engine driven through its HTTP API. Build with :func:`open_engine`."""

    def __init__(
        self,
        client: EngineClient,
        *,
        engine: str,
        version: str = "",
        helpers: list[HelperProcess] | None = None,
        note: str = "",
        info_store: InfoStore | None = None,
    ) -> None:
        self.client = client
        self.engine = engine
        self.name = f"{engine}-api"
        self.version = version
        self.note = note
        """How the endpoint was found, e.g. ``started by kernelbridge`` (for ``doctor``)."""
        self.images = EngineImages(client)
        self._helpers = helpers or []
        self._ended_here: set[str] = set()
        """Ids and names of containers this backend removed (see ``inspect``)."""
        self._never_started: set[str] = set()
        """Ids of containers this backend created and has not attached to yet: ``attach`` starts
        them without asking the engine for their state first."""
        # ``info_store``: where a LOCAL engine's info may be kept for this user's other processes
        # (its opener knows which podman this is); podman only, docker answers /info from memory.
        if info_store is not None and engine == "podman":
            self._info = InfoCache(store=info_store.with_backend(self.name, self.endpoint.url, version))
        else:
            self._info = InfoCache()

    @property
    def endpoint(self) -> Endpoint:
        return self.client.endpoint

    def __repr__(self) -> str:
        return f"<EngineRuntime {self.name} at {self.endpoint.url}>"

    # -- containers ---------------------------------------------------------------------------------

    async def create(self, spec: ContainerSpec) -> str:
        if (why := unsupported(self.engine, sandbox_flags(spec))) is not None:
            raise RuntimeUnavailable(why)
        try:
            answer = await self.client.request(
                "POST",
                "/containers/create",
                query={"name": spec.name},
                body=create_body(spec),
                what=f"to create container {spec.name}",
            )
        except EngineRefused as exc:
            # Both engines answer 404 for a missing image; never pull: that is the caller's build.
            if exc.status == 404 or "no such image" in exc.reason.lower():
                raise ImageError(
                    f"the sandbox image {spec.image} is missing on the {self.engine} engine at "
                    f"{self.endpoint.url}; run `kernelbridge image build`"
                ) from None
            raise
        container_id = (answer.json() or {}).get("Id")
        if not isinstance(container_id, str) or not container_id:
            raise RuntimeUnavailable(f"the {self.engine} engine created {spec.name} but returned no id")
        self._never_started.add(container_id)
        return container_id

    async def attach(self, container: str) -> ContainerStream:
        path = f"/containers/{quote(container)}"
        if container in self._never_started:
            self._never_started.discard(container)
            start = True
        else:
            start = await self._created_not_started(container)
        # Attach first, start second: output written before we attached would be lost otherwise
        # (there is no log to replay it from). podman prepares (runtime-creates) the container
        # on attach, so an OCI failure may already surface here as a 409.
        response, network = await self.client.hijack(
            f"{path}/attach",
            {"stream": True, "stdin": True, "stdout": True, "stderr": True},
            what=f"to attach to {container}",
        )
        stream = EngineStream(response, network)
        try:
            if start:
                await self.client.request("POST", f"{path}/start", what=f"to start {container}")
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        # Both engines reach a running container again this way, and only this way: podman (4.3
        # here) never asks conmon to leave a container's stdin open (`--leave-stdin-open`), so a
        # second attach gets stdout only; docker would take StdinOnce=false, but one mechanism for
        # both is one mechanism to test. An exec session's stdio is hijacked like attach's.
        where = f"to run {command[0] if command else '?'} in {container}"
        body = {
            "AttachStdin": True,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Privileged": False,
            "User": user,
            "WorkingDir": workdir,
            "Env": [f"{name}={value}" for name, value in env],
            "Cmd": list(command),
        }
        try:
            answer = await self.client.request(
                "POST", f"/containers/{quote(container)}/exec", body=body, what=where
            )
        except EngineRefused as exc:
            if no_such(exc) or exc.status in (404, 409):
                why = "does not exist" if no_such(exc) or exc.status == 404 else "is not running"
                raise RuntimeUnavailable(f"cannot attach to {container} again: it {why}") from None
            raise
        exec_id = (answer.json() or {}).get("Id")
        if not isinstance(exec_id, str) or not exec_id:
            raise RuntimeUnavailable(f"the {self.engine} engine made no exec session in {container}")
        response, network = await self.client.hijack(
            f"/exec/{quote(exec_id)}/start", {}, body={"Detach": False, "Tty": False}, what=where
        )
        return EngineStream(response, network)

    async def _created_not_started(self, container: str) -> bool:
        """Whether a container this backend did not just create (a running sandbox a new bridge
        adopts, say) is still to be started: only if the engine says it was created and not
        started. Asked *before* attaching, because attaching to an exited container is no
        question to leave to the engines: podman's compat attach starts it again by itself
        (podman 4.3), docker's waits for a start that never comes. (One that exits between this
        question and the attachment is run again by podman: the window is one round trip.)

        Raises RuntimeUnavailable when the container is gone or has exited."""
        info = await self.inspect(container)
        if info is None or info.state in (
            ContainerState.EXITED,
            ContainerState.STOPPING,
            ContainerState.REMOVING,
        ):
            why = "does not exist" if info is None else f"has exited (status {info.exit_code})"
            raise RuntimeUnavailable(f"cannot attach to {container}: it {why}; it is not started again")
        return info.state is ContainerState.CREATED

    async def remove(self, containers: list[str]) -> None:
        self._ended_here.update(containers)
        self._never_started.difference_update(containers)
        failures: list[RuntimeUnavailable] = []

        async def remove_one(container: str) -> None:
            try:
                await self._remove_one(container)
            except RuntimeUnavailable as exc:
                failures.append(exc)

        unique = list(dict.fromkeys(containers))
        async with anyio.create_task_group() as tg:
            for container in unique:
                tg.start_soon(remove_one, container)
        if len(failures) == 1:
            raise failures[0]
        if failures:
            raise RuntimeUnavailable(
                f"{len(failures)} of {len(unique)} containers were not removed; the first: {failures[0]}"
            )

    async def _remove_one(self, container: str) -> None:
        delay = REMOVE_RETRY_DELAY
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                await self.client.request(
                    "DELETE",
                    f"/containers/{quote(container)}",
                    query={"force": True, "v": True},
                    what=f"to remove {container}",
                )
                return
            except EngineRefused as exc:
                if no_such(exc):
                    return
                if attempt == REMOVE_ATTEMPTS - 1 or (exc.status != 409 and exc.status < 500):
                    if await self._gone(container):
                        return  # another client removed it meanwhile: what we asked for
                    raise
                await anyio.sleep(delay)
                delay *= 2

    async def _gone(self, container: str) -> bool:
        """Whether the engine no longer has ``container`` (False when it cannot say)."""
        try:
            return await self.inspect(container) is None
        except RuntimeUnavailable:
            return False

    async def inspect(self, container: str) -> ContainerInfo | None:
        async def ask() -> EngineResponse:
            return await self.client.request("GET", f"/containers/{quote(container)}/json")

        try:
            answer = await retrying(ask, f"inspecting {container}", when=process_ended)
        except EngineRefused as exc:
            if no_such(exc) or half_removed(exc):
                return None
            raise
        data = answer.json() or {}
        state = data.get("State") or {}
        status = _STATES.get(str(state.get("Status", "")).lower(), ContainerState.UNKNOWN)
        raw_code = state.get("ExitCode")
        exit_code = int(raw_code) if status is ContainerState.EXITED and raw_code is not None else None
        cid, name = str(data.get("Id", "")), str(data.get("Name", "")).lstrip("/")
        oom = bool(state.get("OOMKilled")) or self._killed_by_oom(exit_code, cid, name)
        return ContainerInfo(
            id=cid,
            name=name,
            labels=dict((data.get("Config") or {}).get("Labels") or {}),
            state=status,
            exit_code=exit_code,
            oom_killed=oom,
        )

    def _killed_by_oom(self, exit_code: int | None, *names: str) -> bool:
        # podman 4.3 never sets OOMKilled with the conmon it ships with (conmon writes its "oom"
        # marker into its working directory, podman looks in the bundle). The agent is PID 1 of
        # the container's pid namespace, which no process inside can SIGKILL; so a SIGKILL that
        # this backend did not send is the kernel's OOM killer (or an operator's `kill -9`,
        # which we cannot tell apart).
        return self.engine == "podman" and exit_code == SIGKILLED and not set(names) & self._ended_here

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        wanted = labels if labels is not None else {SESSION_LABEL: ""}
        filters = {"label": [f"{k}={v}" if v else k for k, v in wanted.items()]} if wanted else {}
        query = {"all": True, "filters": filters}
        path = "/libpod/containers/json" if self.engine == "podman" else "/containers/json"

        async def ask() -> list[Any]:
            answer = await self.client.request("GET", path, query=query, what="to list containers")
            rows = answer.json()
            return rows if isinstance(rows, list) else []

        rows = await retrying(ask, f"listing the {self.engine} engine's containers")
        return [_listed(row) for row in rows if isinstance(row, dict)]

    async def ended(self, container: str) -> ContainerInfo | None:
        # podman names the event "died" in a filter and "die" in what it answers (docker's word).
        event = "died" if self.engine == "podman" else "die"
        query: dict[str, object] = {
            "since": 1,  # from the first event the engine kept (docker: only then are past ones sent)
            "filters": {"container": [container], "event": [event]},
        }
        if self.engine == "podman":
            # podman stops reading at once when `until` has passed by the time it starts reading.
            query["stream"] = False
        else:
            query["until"] = int(time.time()) + 1  # the answer ends instead of streaming
        try:
            answer = await self.client.request(
                "GET", "/events", query=query, timeout=EVENTS_TIMEOUT, what=f"for the events of {container}"
            )
        except RuntimeUnavailable as exc:
            log.debug("the %s engine's events of %s: %s", self.engine, container, exc)
            return None
        found = None
        for line in answer.body.splitlines():
            try:
                info = died(json.loads(line), container)
            except ValueError:
                continue
            if info is not None:  # the last death counts (a container may have been restarted)
                found = replace(info, oom_killed=self._killed_by_oom(info.exit_code, info.id, info.name))
        return found

    # -- the engine ---------------------------------------------------------------------------------

    async def info(self) -> RuntimeInfo:
        """The engine's facts, asked again once ``INFO_TTL`` has passed (:class:`InfoCache`)."""
        return await self._info.get(self._ask_info)

    async def _ask_info(self) -> RuntimeInfo:
        if self.engine == "podman":
            return await self._ask_podman_info()
        info = (await self.client.request("GET", "/info", what="for its info")).json() or {}
        cgroup = str(info.get("CgroupVersion") or "")
        rootless = any("rootless" in str(s) for s in info.get("SecurityOptions") or [])
        return RuntimeInfo(
            name=self.name,
            engine=self.engine,
            version=str(info.get("ServerVersion") or self.version),
            endpoint=self.endpoint.url,
            rootless=rootless,
            cgroup_version=f"v{cgroup}" if cgroup else "",
            oci_runtime=str(info.get("DefaultRuntime") or ""),
            # Rootless engines on cgroup v1 accept --memory and --pids-limit and ignore them.
            limits_enforced=bool(info.get("MemoryLimit", True))
            and bool(info.get("PidsLimit", True))
            and not (rootless and cgroup == "1"),
            storage_driver=str(info.get("Driver") or ""),
            reattach=True,
        )

    async def _ask_podman_info(self) -> RuntimeInfo:
        """podman's facts from libpod's own ``/libpod/info`` alone: its docker-compatible ``/info``
        never says "rootless", and each of the two asks podman to look up the packages of conmon,
        runc and slirp4netns again (six dpkg-query runs, ~0.25 CPU-s, per ask)."""
        info = (await self.client.request("GET", "/libpod/info", what="for its libpod info")).json() or {}
        host = info.get("host") or {}
        rootless = bool((host.get("security") or {}).get("rootless"))
        cgroup = str(host.get("cgroupVersion") or "")
        controllers = host.get("cgroupControllers")
        # The controllers the engine may use (a rootless cgroup v2 without delegation lacks them).
        delegated = controllers is None or {"memory", "pids"} <= {str(c) for c in controllers}
        return RuntimeInfo(
            name=self.name,
            engine=self.engine,
            version=str((info.get("version") or {}).get("Version") or self.version),
            endpoint=self.endpoint.url,
            rootless=rootless,
            cgroup_version=cgroup if cgroup.startswith("v") or not cgroup else f"v{cgroup}",
            oci_runtime=str((host.get("ociRuntime") or {}).get("name") or ""),
            limits_enforced=delegated and not (rootless and cgroup in ("v1", "1")),
            storage_driver=str((info.get("store") or {}).get("graphDriverName") or ""),
            reattach=True,
        )

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.client.aclose()
            for helper in reversed(self._helpers):
                await helper.stop()
            self._helpers.clear()


def _listed(row: dict[str, Any]) -> ContainerInfo:
    names = row.get("Names") or []
    name = str(names[0]) if names else ""
    return ContainerInfo(
        id=str(row.get("Id", "")),
        name=name.lstrip("/"),
        labels={str(k): str(v) for k, v in (row.get("Labels") or {}).items()},
        state=_STATES.get(str(row.get("State", "")).lower(), ContainerState.UNKNOWN),
    )


async def open_engine(
    client: EngineClient,
    *,
    helpers: list[HelperProcess] | None = None,
    note: str = "",
    info_store: InfoStore | None = None,
) -> EngineRuntime:
    """Ask the engine behind ``client`` who it is and wrap it: ``GET /_ping``, whose
    ``Libpod-Api-Version`` header names podman and its version (podman's ``/version`` costs ~0.5 s
    of package lookups), else ``GET /version`` of docker. ``info_store``: see :class:`EngineRuntime`.

    Raises RuntimeUnavailable (and closes ``client`` and ``helpers``) when it does not answer.
    """
    try:
        ping = await client.request("GET", "/_ping", what="for a ping")
        if podman := ping.headers.get(PODMAN_HEADER):
            engine, version = "podman", podman
        else:
            answer = (await client.request("GET", "/version", what="for its version")).json() or {}
            engine, version = "docker", str(answer.get("Version") or "")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await client.aclose()
            for helper in helpers or []:
                await helper.stop()
        raise
    client.engine = engine
    return EngineRuntime(
        client, engine=engine, version=version, helpers=helpers, note=note, info_store=info_store
    )
