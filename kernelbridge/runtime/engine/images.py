"""The images of one engine through its API: the engine backend's :class:`ImageStore`.

It uses the backend's own :class:`~kernelbridge.runtime.engine.transport.EngineClient` (one
connection pool per engine), so whatever reaches the engine's containers (a local socket, TLS, an
ssh forward) reaches its images too. Endpoints, the same on dockerd and podman's compat API:
``GET /images/{name}/json``, ``POST /images/create?fromSrc=-`` (import a root file system
tarball with ``changes``), ``POST /images/{name}/tag``, ``GET /images/json``, ``DELETE
/images/{name}``, ``POST /build`` (a tarball of the build context), ``GET /images/{name}/get``
(a docker-archive, streamed to a file) and ``POST /images/load``. Import, build and load answer 200
and stream JSON progress: a failure, and the new image's id, are inside that stream.
"""

from __future__ import annotations

import builtins
import json
import tarfile
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio

from kernelbridge.errors import EngineRefused, ImageError
from kernelbridge.runtime.base import ImageInfo, ImageStore, loaded_references
from kernelbridge.runtime.engine.transport import EngineClient
from kernelbridge.runtime.races import image_vanished, retrying

IMPORT_TIMEOUT = 600.0
"""Bound of an image import: a 500 MB root file system takes ~15 s here; a remote engine over a
slow link much longer."""
BUILD_TIMEOUT = 3600.0
"""A Containerfile build downloads and installs packages: minutes on a slow mirror. Past an hour
the build (or the engine) is wedged."""
ARCHIVE_TIMEOUT = 600.0
"""Bound of a save or a load: the 0.9 GB image takes well under a minute each way here; a remote
engine over a slow link much longer."""
UPLOAD_CHUNK = 1024 * 1024
PROGRESS_LINES = 3
"""Lines of a failed build's output that go into its ImageError."""


def no_such(exc: EngineRefused) -> bool:
    """The engine said that the container or image does not exist."""
    reason = exc.reason.lower()
    return exc.status == 404 or "no such" in reason or "not found" in reason


class EngineImages(ImageStore):
    """The images of the engine behind ``client``."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    def _where(self) -> str:
        return f"the {self.client.engine} engine at {self.client.endpoint.url}"

    async def labels(self, image: str) -> dict[str, str] | None:
        try:
            answer = await self.client.request("GET", f"/images/{_image_path(image)}/json")
        except EngineRefused as exc:
            if no_such(exc):
                return None
            raise
        config = (answer.json() or {}).get("Config") or {}
        return {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        events = await self._upload(
            "/images/create",
            # No repo/tag here: podman 4.3's compat import ignores `tag` (and names the image
            # docker.io/library/<repo>:latest); tagging the new image by id works on both.
            {"fromSrc": "-", "changes": list(changes)},
            tarball,
            timeout=IMPORT_TIMEOUT,
            what=f"importing {tag} into {self._where()}",
        )
        image_id = ""
        for event in events:
            status = str(event.get("status") or "")
            if status.startswith("sha256:"):
                image_id = status
        if not image_id:
            raise ImageError(f"{self._where()} imported {tag} but named no image id")
        await self.tag(image_id, tag)

    async def tag(self, image: str, tag: str) -> None:
        repo, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        try:
            await self.client.request(
                "POST", f"/images/{_image_path(image)}/tag", query={"repo": repo, "tag": version}
            )
        except EngineRefused as exc:
            raise ImageError(f"tagging {image} as {tag} failed: {exc.reason}") from None

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> list[ImageInfo]:
        filters: dict[str, list[str]] = {}
        if labels:
            filters["label"] = [f"{k}={v}" if v else k for k, v in labels.items()]
        if repository:
            filters["reference"] = [repository]
        query = {"filters": filters} if filters else {}
        # podman 4.3 fails the whole listing when one image goes while it looks ("image not
        # known"; the CLI's `images` does the same); asked again, it answers.
        answer = await retrying(
            lambda: self.client.request("GET", "/images/json", query=query, what="to list images"),
            f"listing the {self.client.engine} engine's images",
            when=image_vanished,
        )
        found = [_listed(row) for row in answer.json() or [] if isinstance(row, dict)]
        if repository:
            found = [image for image in found if image.in_repository(repository)]
        return found

    async def remove(self, image: str) -> bool:
        try:
            await self.client.request(
                "DELETE", f"/images/{_image_path(image)}", what=f"to remove image {image}"
            )
        except EngineRefused as exc:
            if exc.status == 409:
                return False  # still used by a container: kept
            if no_such(exc):
                return True
            raise
        return True

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: str = "Containerfile",
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        with tempfile.TemporaryDirectory(prefix="kernelbridge-context-") as tmp:
            tarball = Path(tmp) / "context.tar"
            await anyio.to_thread.run_sync(_tar_directory, context, tarball)
            events = await self._upload(
                "/build",
                {"t": tag, "dockerfile": containerfile, "buildargs": dict(build_args or {}), "rm": True},
                tarball,
                timeout=BUILD_TIMEOUT,
                what=f"building {tag} on {self._where()}",
            )
        if await self.labels(tag) is None:
            said = " | ".join(_progress(events)[-PROGRESS_LINES:]) or "no output"
            raise ImageError(f"building {tag} on {self._where()} made no image: {said}")

    async def save(self, image: str, archive: Path) -> None:
        what = f"saving {image} from {self._where()}"
        try:
            await self.client.download(
                f"/images/{_image_path(image)}/get", archive, timeout=ARCHIVE_TIMEOUT, what=what
            )
        except EngineRefused as exc:
            raise ImageError(f"{what} failed: {exc.reason}") from None
        except OSError as exc:
            raise ImageError(f"{what} failed: cannot write {archive} ({exc.strerror})") from None

    async def load(self, archive: Path) -> builtins.list[str]:
        events = await self._upload(
            "/images/load",
            {"quiet": True},
            archive,
            timeout=ARCHIVE_TIMEOUT,
            what=f"loading {archive.name} into {self._where()}",
        )
        return loaded_references("\n".join(str(event.get("stream") or "") for event in events))

    async def _upload(
        self, path: str, query: Mapping[str, object], tarball: Path, *, timeout: float, what: str
    ) -> builtins.list[dict[str, Any]]:
        """POST ``tarball`` to ``path``; the progress events the engine streamed back. Raises
        ImageError with the engine's reason when it refused or reported an error."""
        try:
            size = (await anyio.Path(tarball).stat()).st_size
        except OSError as exc:
            raise ImageError(f"cannot read {tarball}: {exc.strerror}") from None
        try:
            answer = await self.client.request(
                "POST",
                path,
                query=query,
                content=_file_chunks(tarball),
                headers={"Content-Type": "application/x-tar", "Content-Length": str(size)},
                timeout=timeout,
                what=what,
            )
        except EngineRefused as exc:
            raise ImageError(f"{what} failed: {exc.reason}") from None
        events = []
        for line in answer.body.decode(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        for event in events:
            error = event.get("error") or (event.get("errorDetail") or {}).get("message")
            if error:
                said = " | ".join(_progress(events)[-PROGRESS_LINES:])
                raise ImageError(
                    f"{what} failed: {' '.join(str(error).split())[:500]}"
                    + (f" (after: {said})" if said else "")
                )
        return events


def _progress(events: list[dict[str, Any]]) -> list[str]:
    """The non-empty lines of a build's ``stream`` output, each cut to a readable length."""
    lines = []
    for event in events:
        for line in str(event.get("stream") or "").splitlines():
            if line.strip():
                lines.append(line.strip()[:300])
    return lines


def _listed(row: dict[str, Any]) -> ImageInfo:
    tags = tuple(str(t) for t in row.get("RepoTags") or [] if not str(t).endswith(":<none>"))
    created = row.get("Created")
    return ImageInfo(
        id=str(row.get("Id", "")),
        tags=tags,
        created=float(created) if isinstance(created, int | float) else 0.0,
        labels={str(k): str(v) for k, v in (row.get("Labels") or {}).items()},
    )


def _image_path(image: str) -> str:
    # The engines route /images/{name:.*}/json: a reference's slashes and colons stay as they are.
    return quote(image, safe="/:@")


def _tar_directory(directory: Path, tarball: Path) -> None:
    """``directory``'s contents as an uncompressed tarball (a build context), symlinks kept."""
    with tarfile.open(tarball, "w") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(UPLOAD_CHUNK):
            yield chunk
