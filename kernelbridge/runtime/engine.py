"""The Docker Engine API backend: dockerd or ``podman system service``, local or remote.

One :class:`EngineRuntime` per engine holds ONE connection pool (``engine_transport``) that every
sandbox's calls share; attaching to a sandbox's stdio hijacks one HTTP connection of that pool
(``engine_stream``), so no client process runs per sandbox. Both engines are spoken to through
the compat API at a pinned version (``engine_transport.API_VERSION``); the few places where
podman and docker answer differently are commented where they are handled.

Errors are translated here: a missing image becomes ImageError, everything else the engine
refuses or cannot do in time becomes RuntimeUnavailable with one line that names the engine and
its endpoint. ``stop`` and ``remove`` ignore containers that are gone; ``inspect`` returns None.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import (
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.engine_endpoint import Endpoint
from kernelbridge.runtime.engine_service import HelperProcess
from kernelbridge.runtime.engine_spec import create_body
from kernelbridge.runtime.engine_stream import EngineStream
from kernelbridge.runtime.engine_transport import API_TIMEOUT, EngineClient, EngineRefused

IMPORT_TIMEOUT = 600.0
"""Bound of an image import: a 500 MB root file system takes ~15 s here; a remote engine over a
slow link much longer."""
IMPORT_CHUNK = 1024 * 1024
REMOVE_ATTEMPTS = 5
REMOVE_RETRY_DELAY = 0.2
"""A container that is stopping on its own cannot be removed for a moment ("removal already in
progress", podman's "container state improper"); once stopped it can."""
LIST_ATTEMPTS = 3
"""podman 4.3 fails a whole listing ("container not known") when a container goes meanwhile."""

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
    "removing": ContainerState.REMOVING,
}
PODMAN_COMPONENT = "Podman Engine"
SIGKILLED = 128 + 9


def _no_such(exc: EngineRefused) -> bool:
    reason = exc.reason.lower()
    return exc.status == 404 or "no such" in reason or "not found" in reason


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
    ) -> None:
        self.client = client
        self.engine = engine
        self.name = f"{engine}-api"
        self.version = version
        self.note = note
        """How the endpoint was found, e.g. ``started by kernelbridge`` (for ``doctor``)."""
        self._helpers = helpers or []
        self._ended_here: set[str] = set()
        """Ids and names of containers this backend stopped or removed (see ``inspect``)."""

    @property
    def endpoint(self) -> Endpoint:
        return self.client.endpoint

    def __repr__(self) -> str:
        return f"<EngineRuntime {self.name} at {self.endpoint.url}>"

    # -- containers ---------------------------------------------------------------------------------

    async def create(self, spec: ContainerSpec) -> str:
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
        return container_id

    async def attach(self, container: str) -> ContainerStream:
        path = f"/containers/{quote(container)}"
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
            await self.client.request("POST", f"{path}/start", what=f"to start {container}")
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def stop(self, container: str, timeout: float = 0) -> None:
        self._ended_here.add(container)
        try:
            await self.client.request(
                "POST",
                f"/containers/{quote(container)}/stop",
                query={"t": int(timeout)},
                timeout=timeout + API_TIMEOUT,
                what=f"to stop {container}",
            )
        except EngineRefused as exc:
            if _no_such(exc) or exc.status == 304:
                return
            raise

    async def remove(self, containers: list[str]) -> None:
        self._ended_here.update(containers)
        async with anyio.create_task_group() as tg:
            for container in dict.fromkeys(containers):
                tg.start_soon(self._remove_one, container)

    async def _remove_one(self, container: str) -> None:
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
                if _no_such(exc):
                    return
                if attempt == REMOVE_ATTEMPTS - 1 or (exc.status != 409 and exc.status < 500):
                    raise
                await anyio.sleep(REMOVE_RETRY_DELAY)

    async def inspect(self, container: str) -> ContainerInfo | None:
        try:
            answer = await self.client.request("GET", f"/containers/{quote(container)}/json")
        except EngineRefused as exc:
            if _no_such(exc):
                return None
            raise
        data = answer.json() or {}
        state = data.get("State") or {}
        status = _STATES.get(str(state.get("Status", "")).lower(), ContainerState.UNKNOWN)
        raw_code = state.get("ExitCode")
        exit_code = int(raw_code) if status is ContainerState.EXITED and raw_code is not None else None
        cid, name = str(data.get("Id", "")), str(data.get("Name", "")).lstrip("/")
        oom = bool(state.get("OOMKilled"))
        if self.engine == "podman" and exit_code == SIGKILLED and not {cid, name} & self._ended_here:
            # podman 4.3 never sets OOMKilled with the conmon it ships with (conmon writes its
            # "oom" marker into its working directory, podman looks in the bundle). The agent is
            # PID 1 of the container's pid namespace, which no process inside can SIGKILL; so a
            # SIGKILL that this backend did not send is the kernel's OOM killer (or an operator's
            # `kill -9`, which we cannot tell apart).
            oom = True
        return ContainerInfo(
            id=cid,
            name=name,
            labels=dict((data.get("Config") or {}).get("Labels") or {}),
            state=status,
            exit_code=exit_code,
            oom_killed=oom,
        )

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        wanted = labels if labels is not None else {SESSION_LABEL: ""}
        filters = {"label": [f"{k}={v}" if v else k for k, v in wanted.items()]} if wanted else {}
        query = {"all": True, "filters": filters}
        for attempt in range(LIST_ATTEMPTS):
            try:
                answer = await self.client.request(
                    "GET", "/containers/json", query=query, what="to list containers"
                )
                break
            except EngineRefused as exc:
                # podman 4.3 fails a whole listing when one container is removed meanwhile.
                if "container not known" not in str(exc) or attempt == LIST_ATTEMPTS - 1:
                    raise
                await anyio.sleep(REMOVE_RETRY_DELAY)
        rows = answer.json() or []
        return [_listed(row) for row in rows if isinstance(row, dict)]

    # -- the engine ---------------------------------------------------------------------------------

    async def info(self) -> RuntimeInfo:
        info = (await self.client.request("GET", "/info", what="for its info")).json() or {}
        security = [str(s) for s in info.get("SecurityOptions") or []]
        rootless = any("rootless" in s for s in security)
        cgroup = str(info.get("CgroupVersion") or "")
        if self.engine == "podman" and not rootless:
            # podman's docker-compatible /info never says "rootless" (docker's does): ask libpod,
            # or a rootless podman on cgroup v1 would pass for one that enforces limits.
            rootless = await self._podman_rootless()
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
        )

    async def _podman_rootless(self) -> bool:
        try:
            answer = await self.client.request("GET", "/libpod/info", what="for its libpod info")
        except (EngineRefused, RuntimeUnavailable):
            return False
        host = (answer.json() or {}).get("host") or {}
        return bool((host.get("security") or {}).get("rootless"))

    # -- images -------------------------------------------------------------------------------------

    async def image_labels(self, image: str) -> dict[str, str] | None:
        try:
            answer = await self.client.request("GET", f"/images/{_image_path(image)}/json")
        except EngineRefused as exc:
            if _no_such(exc):
                return None
            raise
        config = (answer.json() or {}).get("Config") or {}
        return {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}

    async def import_image(self, tarball: Path, tag: str, changes: list[str]) -> None:
        try:
            size = (await anyio.Path(tarball).stat()).st_size
        except OSError as exc:
            raise ImageError(f"cannot read the image tarball {tarball}: {exc.strerror}") from None
        try:
            answer = await self.client.request(
                "POST",
                "/images/create",
                # No repo/tag here: podman 4.3's compat import ignores `tag` (and names the image
                # docker.io/library/<repo>:latest); tagging the new image by id works on both.
                query={"fromSrc": "-", "changes": changes},
                content=_file_chunks(tarball),
                headers={"Content-Type": "application/x-tar", "Content-Length": str(size)},
                timeout=IMPORT_TIMEOUT,
                what=f"to import {tag}",
            )
        except EngineRefused as exc:
            raise ImageError(f"importing {tag} into the {self.engine} engine failed: {exc.reason}") from None
        # The engine streams JSON progress with a 200; a failure, and the new id, are inside it.
        image_id = ""
        for line in answer.body.decode(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("error"):
                raise ImageError(f"importing {tag} into the {self.engine} engine failed: {event['error']}")
            status = str(event.get("status") or "")
            if status.startswith("sha256:"):
                image_id = status
        if not image_id:
            raise ImageError(f"the {self.engine} engine imported {tag} but named no image id")
        await self.tag_image(image_id, tag)

    async def tag_image(self, image: str, tag: str) -> None:
        repo, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        try:
            await self.client.request(
                "POST", f"/images/{_image_path(image)}/tag", query={"repo": repo, "tag": version}
            )
        except EngineRefused as exc:
            raise ImageError(f"tagging {image} as {tag} failed: {exc.reason}") from None

    async def list_images(self, repository: str) -> list[str]:
        answer = await self.client.request(
            "GET", "/images/json", query={"filters": {"reference": [repository]}}, what="to list images"
        )
        tags: list[str] = []
        for row in answer.json() or []:
            tags += [t for t in row.get("RepoTags") or [] if t.rpartition(":")[0] == repository]
        return sorted(set(tags))

    async def remove_image(self, image: str) -> bool:
        try:
            await self.client.request(
                "DELETE", f"/images/{_image_path(image)}", what=f"to remove image {image}"
            )
        except EngineRefused as exc:
            if exc.status == 409:
                return False  # still used by a container: kept
            if _no_such(exc):
                return True
            raise
        return True

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.client.aclose()
            for helper in reversed(self._helpers):
                await helper.stop()
            self._helpers.clear()


def _image_path(image: str) -> str:
    # The engines route /images/{name:.*}/json: a reference's slashes and colons stay as they are.
    return quote(image, safe="/:@")


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(IMPORT_CHUNK):
            yield chunk


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
    client: EngineClient, *, helpers: list[HelperProcess] | None = None, note: str = ""
) -> EngineRuntime:
    """Ask the engine behind ``client`` who it is (``GET /version``) and wrap it.

    Raises RuntimeUnavailable (and closes ``client`` and ``helpers``) when it does not answer.
    """
    try:
        version = (await client.request("GET", "/version", what="for its version")).json() or {}
    except BaseException:
        with anyio.CancelScope(shield=True):
            await client.aclose()
            for helper in helpers or []:
                await helper.stop()
        raise
    components = [str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict)]
    engine = "podman" if PODMAN_COMPONENT in components else "docker"
    client.engine = engine
    return EngineRuntime(
        client, engine=engine, version=str(version.get("Version") or ""), helpers=helpers, note=note
    )
