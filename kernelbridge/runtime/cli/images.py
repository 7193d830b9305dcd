"""The images of a ``podman`` / ``docker`` command line: the CLI backend's :class:`ImageStore`.

One bounded CLI call per verb (two for ``list``: the ids, then one ``image inspect`` of them all,
whose JSON both CLIs spell alike). Failures become ImageError (or RuntimeUnavailable when the CLI
cannot reach its engine) with the CLI's last line of stderr.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import ImageInfo, ImageStore, loaded_references
from kernelbridge.runtime.cli.command import Cli, image_missing
from kernelbridge.runtime.races import image_vanished, retrying

IMPORT_TIMEOUT = 600.0
"""An image import copies hundreds of MB."""
BUILD_TIMEOUT = 3600.0
"""A Containerfile build downloads and installs packages: minutes on a slow mirror. Past an hour
the build (or the engine) is wedged."""
ARCHIVE_TIMEOUT = 600.0
"""Bound of a save or load: the 0.9 GB image takes well under a minute each way here."""
_IN_USE = ("in use", "used by", "conflict", "must be forced", "must force")
_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?")


class CliImages(ImageStore):
    """The images of the engine behind ``cli``."""

    def __init__(self, cli: Cli) -> None:
        self.cli = cli

    async def labels(self, image: str) -> dict[str, str] | None:
        try:
            text = await self.cli.run("image", "inspect", image)
        except RuntimeUnavailable as exc:
            if image_missing(exc):
                return None
            raise
        try:
            (info,) = json.loads(text)
        except ValueError:
            return None
        return _labels(info)

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        argv = ["import", *(f"--change={change}" for change in changes), str(tarball), tag]
        try:
            await self.cli.run(*argv, timeout=IMPORT_TIMEOUT)
        except RuntimeUnavailable as exc:
            raise ImageError(f"{exc}; check free disk space and `{self.cli.engine} info`") from None

    async def tag(self, image: str, tag: str) -> None:
        try:
            await self.cli.run("tag", image, tag)
        except RuntimeUnavailable as exc:
            raise ImageError(f"{exc}; check `{self.cli.engine} images`") from None

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> list[ImageInfo]:
        args = ["images", "--quiet", "--no-trunc"]
        for key, value in (labels or {}).items():
            args += ["--filter", f"label={key}={value}" if value else f"label={key}"]
        if repository:
            args += ["--filter", f"reference={repository}"]
        # podman 4.3 fails a whole `images` listing when one image goes while it looks ("image
        # not known": another build pruning its old images); asked again, it answers.
        listed = await retrying(
            lambda: self.cli.run(*args), f"`{self.cli.engine} images`", when=image_vanished
        )
        ids = list(dict.fromkeys(listed.split()))
        rows = await self._inspect(ids)
        found = [_image(row) for row in rows]
        if repository:
            found = [image for image in found if image.in_repository(repository)]
        return found

    async def _inspect(self, ids: builtins.list[str]) -> builtins.list[dict[str, Any]]:
        """``image inspect`` of ``ids``; one by one (skipping the missing) if one went meanwhile
        (another build pruning its old images)."""
        if not ids:
            return []
        try:
            return list(json.loads(await self.cli.run("image", "inspect", *ids)))
        except RuntimeUnavailable as exc:
            if not image_missing(exc):
                raise
        if len(ids) == 1:
            return []
        rows: builtins.list[dict[str, Any]] = []
        for one in ids:
            rows += await self._inspect([one])
        return rows

    async def remove(self, image: str) -> bool:
        try:
            await self.cli.run("rmi", image)
        except RuntimeUnavailable as exc:
            if image_missing(exc):
                return True
            if any(marker in str(exc).lower() for marker in _IN_USE):
                return False
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
        argv = ["build", "--file", str(context / containerfile), "--tag", tag]
        for key, value in (build_args or {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        try:
            await self.cli.run(*argv, str(context), timeout=BUILD_TIMEOUT)
        except RuntimeUnavailable as exc:
            raise ImageError(str(exc)) from None

    async def save(self, image: str, archive: Path) -> None:
        # Both CLIs write a docker-archive by default (podman's --format would be docker-archive).
        try:
            await self.cli.run("save", "--output", str(archive), image, timeout=ARCHIVE_TIMEOUT)
        except RuntimeUnavailable as exc:
            raise ImageError(f"{exc}; check free disk space") from None

    async def load(self, archive: Path) -> builtins.list[str]:
        try:
            said = await self.cli.run("load", "--input", str(archive), timeout=ARCHIVE_TIMEOUT)
        except RuntimeUnavailable as exc:
            raise ImageError(f"{exc}; check free disk space and `{self.cli.engine} info`") from None
        return loaded_references(said)


def _labels(info: dict[str, Any]) -> dict[str, str]:
    # podman puts the labels at top level and under Config; docker only under Config.
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    return {str(key): str(value) for key, value in labels.items()}


def _image(row: dict[str, Any]) -> ImageInfo:
    tags = tuple(str(t) for t in row.get("RepoTags") or [] if not str(t).endswith(":<none>"))
    return ImageInfo(str(row.get("Id", "")), tags, parse_time(str(row.get("Created") or "")), _labels(row))


def parse_time(text: str) -> float:
    """An RFC 3339 time as ``image inspect`` prints it (nanoseconds, ``Z`` or an offset) -> epoch
    seconds; 0 when it is not one."""
    match = _TIME.match(text.strip())
    if not match:
        return 0.0
    base, fraction, zone = match.groups()
    zone = "+00:00" if zone in (None, "Z") else zone
    if len(zone) == 5:  # +0200
        zone = f"{zone[:3]}:{zone[3:]}"
    stamp = datetime.fromisoformat(f"{base}.{(fraction or '0')[:6]:0<6}{zone}")
    return stamp.timestamp()
