"""The sandbox images of a cluster: what its nodes hold, and the labels each was built with.

Presence is the nodes' report (``Node.status.images``, where the bridge may read nodes); labels are
a record per image in the ConfigMap :data:`RECORDS`; writes (``import_rootfs``, ``tag``, ``build``)
happen in a local engine's store, then ``KERNELBRIDGE_KUBE_IMAGE_LOADER`` loads the image onto the
nodes (without one they raise ImageError) and it is recorded. ``remove`` forgets the record and the
local image. Design: ``docs/kubernetes.md`` ("The image"), docs/design/runtime.md.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import ImageInfo, ImageStore
from kernelbridge.runtime.kube.errors import ClusterRefused

RECORDS = "kernelbridge-images"
LOAD_TIMEOUT = 900.0
"""Loading the 0.9 GB image onto a node (``podman save | ctr import``): about a minute here."""
_KEY = re.compile(r"[^-._a-zA-Z0-9]")
HOW_TO_LOAD = (
    "load it onto the cluster's nodes (the development cluster: scripts/kube-cluster.sh import IMAGE; "
    "kind: kind load docker-image IMAGE; containerd: ctr -n k8s.io images import) or set "
    "KERNELBRIDGE_KUBE_IMAGE_LOADER to the command that does"
)


def record_key(image: str) -> str:
    return _KEY.sub("_", image)[:253]


class KubeImages(ImageStore):
    """See the module docstring. ``api`` is a ``kube.api.Api``; ``local`` the store images are
    built in (None: no local engine); ``loader`` the command that loads an image onto the nodes."""

    def __init__(self, api: Any, namespace: str, local: ImageStore | None, loader: tuple[str, ...]) -> None:
        self.api = api
        self.namespace = namespace
        self.local = local
        self.loader = loader

    def _path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{RECORDS}"

    async def _records(self) -> dict[str, dict[str, Any]]:
        try:
            found = await self.api.json("GET", self._path(), what="to read the sandbox images' records")
        except ClusterRefused as exc:
            if exc.status == 404:
                return {}
            raise
        records: dict[str, dict[str, Any]] = {}
        for value in ((found or {}).get("data") or {}).values():
            try:
                entry = json.loads(value)
                entry["labels"] = {str(k): str(v) for k, v in (entry.get("labels") or {}).items()}
                records[str(entry["image"])] = entry
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return records

    async def on_nodes(self) -> set[str] | None:
        """Every image name the nodes report; None when the bridge may not read nodes."""
        try:
            nodes = await self.api.json("GET", "/api/v1/nodes", what="to list the nodes' images")
        except ClusterRefused as exc:
            if exc.status in (401, 403):
                return None
            raise
        names: set[str] = set()
        for node in (nodes or {}).get("items") or []:
            for image in (node.get("status") or {}).get("images") or []:
                names.update(str(n) for n in image.get("names") or [])
        return names

    async def labels(self, image: str) -> dict[str, str] | None:
        # The record alone: a node reports an image it just got only at its next status update
        # (10 s), and the loader's success is the better word for it meanwhile.
        entry = (await self._records()).get(image)
        return None if entry is None else dict(entry["labels"])

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> builtins.list[ImageInfo]:
        by_id: dict[str, builtins.list[dict[str, Any]]] = {}
        for image, entry in (await self._records()).items():
            by_id.setdefault(str(entry.get("id") or image), []).append(entry)
        found = []
        for image_id, entries in by_id.items():
            image_labels = entries[0]["labels"]
            tags = tuple(sorted(str(e["image"]) for e in entries))
            created = float(entries[0].get("created") or 0.0)
            info = ImageInfo(id=image_id, tags=tags, created=created, labels=image_labels)
            if repository is not None and not info.in_repository(repository):
                continue
            if labels and any(
                k not in image_labels or (v and image_labels[k] != v) for k, v in labels.items()
            ):
                continue
            found.append(info)
        return found

    async def remove(self, image: str) -> bool:
        """Forget ``image`` (and remove it from the local store); False while a pod uses it."""
        pods = await self.api.json("GET", f"/api/v1/namespaces/{self.namespace}/pods", what="to list pods")
        for pod in (pods or {}).get("items") or []:
            if any(c.get("image") == image for c in (pod.get("spec") or {}).get("containers") or []):
                return False
        if self.local is not None and not await self.local.remove(image):
            return False
        patch = {"data": {record_key(image): None}}
        try:
            await self.api.json("PATCH", self._path(), patch, merge=True, what=f"to forget image {image}")
        except ClusterRefused as exc:
            if exc.status != 404:
                raise
        return True

    async def record(
        self, image: str, labels: Mapping[str, str], image_id: str = "", created: float = 0.0
    ) -> None:
        """Keep ``image``'s labels in the records (the ConfigMap is made if missing)."""
        entry = {"image": image, "labels": dict(labels), "id": image_id or image, "created": created}
        value = json.dumps(entry, sort_keys=True)
        patch = {"data": {record_key(image): value}}
        try:
            await self.api.json("PATCH", self._path(), patch, merge=True, what=f"to record image {image}")
        except ClusterRefused as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": RECORDS}, **patch}
            await self.api.json(
                "POST", f"/api/v1/namespaces/{self.namespace}/configmaps", body, what="to record images"
            )

    # -- writes: a local engine's store, then the loader -------------------------------------------
    def _writer(self, what: str) -> ImageStore:
        if self.local is None or not self.loader:
            raise ImageError(
                f"cannot {what} through the Kubernetes API: build the image locally and {HOW_TO_LOAD}"
            )
        return self.local

    async def _load(self, image: str) -> None:
        assert self.local is not None
        labels = await self.local.labels(image)
        if labels is None:
            raise ImageError(f"{image} is not in the local image store to load onto the cluster")
        argv = [*self.loader, image]
        try:
            with anyio.fail_after(LOAD_TIMEOUT):
                done = await anyio.run_process(argv, check=False, stdin=None)
        except TimeoutError:
            raise ImageError(
                f"{' '.join(self.loader)} did not load {image} within {LOAD_TIMEOUT:g} s"
            ) from None
        except OSError as exc:
            raise ImageError(
                f"KERNELBRIDGE_KUBE_IMAGE_LOADER={' '.join(self.loader)}: {exc.strerror or exc}"
            ) from None
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise ImageError(
                f"loading {image} onto the cluster failed: {said[-1][:300] if said else done.returncode}"
            )
        local = [i for i in await self.local.list() if image in i.tags]
        try:
            await self.record(image, labels, local[0].id if local else "", local[0].created if local else 0.0)
        except RuntimeUnavailable as exc:
            raise ImageError(f"{image} was loaded but could not be recorded: {exc}") from None

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        await self._writer("import an image").import_rootfs(tarball, tag, changes)
        await self._load(tag)

    async def tag(self, image: str, tag: str) -> None:
        await self._writer("tag an image").tag(image, tag)
        await self._load(tag)

    async def save(self, image: str, archive: Path) -> None:
        """From the local store the images are built in (the API cannot read a node's images)."""
        await self._writer("save an image").save(image, archive)

    async def load(self, archive: Path) -> builtins.list[str]:
        """Into the local store, then onto the nodes with the loader, as a build is."""
        loaded = await self._writer("load an image").load(archive)
        for reference in loaded:
            await self._load(reference)
        return loaded

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: str = "Containerfile",
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        writer = self._writer("build an image")
        await writer.build(context, tag, containerfile=containerfile, build_args=build_args)
        await self._load(tag)
