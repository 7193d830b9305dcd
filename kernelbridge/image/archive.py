"""The sandbox image as a file: saved from one machine's image store, loaded into another's, so a
machine gets the image without building it (``kernelbridge image save FILE`` / ``image load FILE``).

The file is a docker-archive tarball (what ``podman save`` and ``docker save`` write: a
``manifest.json`` naming each image's config and layers, and the ``RepoTags`` it had), written and
loaded through the runtime's :class:`~kernelbridge.runtime.ImageStore`. A file to load is untrusted
until its own manifest and config say otherwise: :func:`read_archive` reads them (bounded) before
the engine sees a byte, so a foreign image, an image of another kernelbridge or a file cut short is
refused in one line and the store is left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio

from kernelbridge.errors import AgentMismatch, ImageError
from kernelbridge.image.labels import (
    HASH_LABEL,
    IMAGE_HASH_LABEL,
    VERSION_LABEL,
    check_labels,
    labels_status,
)
from kernelbridge.image.recipe import image_tag
from kernelbridge.runtime.base import ImageStore

MAX_MEMBERS = 10_000
"""Entries of an archive looked at: the image's archive has a handful (its layers, a config, the
manifest); past this it is not one of ours, and reading on would only cost time."""
MAX_JSON_BYTES = 1024 * 1024
"""Bytes of ``manifest.json`` and of an image config read: ours are a few KiB."""


@dataclass(frozen=True, slots=True)
class ArchivedImage:
    """What an archive says of the one image it holds, before it is loaded."""

    tags: tuple[str, ...]
    labels: dict[str, str]

    @property
    def image_hash(self) -> str:
        """The image hash its labels name (images from before the image-hash label: the agent's)."""
        return self.labels.get(IMAGE_HASH_LABEL) or self.labels.get(HASH_LABEL, "")


def read_archive(path: Path) -> ArchivedImage:
    """The image of the docker-archive at ``path`` (plain or gzip/bzip2/xz-compressed).

    Raises ImageError (one line) when the file cannot be read, is not a tarball, holds no whole
    docker-archive (no manifest, a layer or config missing, a member cut short: a truncated
    copy), or holds more than one image.
    """
    name = path.name
    try:
        # tarfile reads every header, and checks that the data before each one is there
        # ("unexpected end of data"): a file cut inside a member fails here, and one cut between
        # members lacks the ones the manifest names (or the manifest itself).
        with tarfile.open(path, "r:*") as tar:
            return _read_manifest(tar, name)
    except ImageError:
        raise
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ImageError(f"{name} is not a whole image archive ({_short(exc)}): a truncated copy?") from None
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_manifest(tar: tarfile.TarFile, name: str) -> ArchivedImage:
    members: dict[str, tarfile.TarInfo] = {}
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise ImageError(f"{name} is not a kernelbridge image archive (over {MAX_MEMBERS} entries)")
        members[member.name.removeprefix("./")] = member
    if "manifest.json" not in members:
        raise ImageError(
            f"{name} is not a docker-archive image file (no manifest.json: not an image, an OCI"
            " archive, or a truncated copy); make one with `kernelbridge image save FILE`"
        )
    manifest = _json(tar, members, "manifest.json", name)
    if not isinstance(manifest, list) or not all(isinstance(entry, dict) for entry in manifest):
        raise ImageError(f"{name}: its manifest.json is not a docker-archive manifest")
    if len(manifest) != 1:
        raise ImageError(f"{name} holds {len(manifest)} images; a sandbox image file holds one")
    (entry,) = manifest
    layers = entry.get("Layers")
    config_name = entry.get("Config")
    if not isinstance(config_name, str) or not isinstance(layers, list):
        raise ImageError(f"{name}: its manifest.json names no config or layers")
    missing = [layer for layer in layers if not isinstance(layer, str) or layer not in members]
    if missing:
        raise ImageError(f"{name} lacks {len(missing)} of its image's layers: a truncated copy?")
    config = _json(tar, members, config_name, name)
    labels = ((config if isinstance(config, dict) else {}).get("config") or {}).get("Labels") or {}
    tags = entry.get("RepoTags") or []
    return ArchivedImage(
        tags=tuple(str(tag) for tag in tags if isinstance(tag, str)),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
    )


def _json(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], member: str, name: str) -> Any:
    info = members.get(member.removeprefix("./"))
    if info is None or not info.isfile():
        raise ImageError(f"{name} lacks {member}, which its manifest names: a truncated copy?")
    if info.size > MAX_JSON_BYTES:
        raise ImageError(f"{name}: {member} is {info.size} bytes, not an image config")
    file: IO[bytes] | None = tar.extractfile(info)
    assert file is not None  # a regular file
    try:
        return json.loads(file.read())
    except ValueError:
        raise ImageError(f"{name}: {member} is not JSON") from None


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def check_archive(archive: ArchivedImage, name: str, expected_agent: str) -> None:
    """Raise ImageError (AgentMismatch: another kernelbridge's) unless ``archive`` holds a
    kernelbridge sandbox image with the agent ``expected_agent``; one line each, with the fix."""
    labels = archive.labels
    found = labels.get(HASH_LABEL)
    if not found:
        raise ImageError(
            f"{name} is not a kernelbridge sandbox image (its image has no {HASH_LABEL} label);"
            " make one with `kernelbridge image save FILE` where the image is built"
        )
    if found != expected_agent:
        built_by = labels.get(VERSION_LABEL, "another version")
        raise AgentMismatch(
            f"{name} holds the sandbox image of kernelbridge {built_by} ({found[:12]}), stale for"
            f" this kernelbridge, which expects {expected_agent[:12]}; save it again from this"
            " version, or build it here with `kernelbridge image build`"
        )


async def save_image(images: ImageStore, image: str, target: Path, expected_agent: str) -> int:
    """Write ``image`` (a kernelbridge image with ``expected_agent``) from ``images`` to ``target``;
    its size in bytes. Written beside ``target`` and renamed over it, so a failure or an
    interruption leaves no partial file under that name.

    Raises ImageError (a missing or foreign image, the engine failed, the file cannot be written).
    """
    check_labels(image, await images.labels(image), expected_agent, explicit=False)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=directory)
    except OSError as exc:
        raise ImageError(f"cannot write into {directory} ({exc.strerror})") from None
    os.close(fd)
    try:
        await images.save(image, Path(partial))
        # Read back what was written: a file that `load` would refuse must not replace the target.
        await anyio.to_thread.run_sync(read_archive, Path(partial))
        # mkstemp's 0600 would keep the file from other users of a shared machine; it holds nothing
        # private (the agent's code, Debian's packages, wheels from PyPI).
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return (await anyio.Path(target).stat()).st_size


@dataclass(frozen=True, slots=True)
class LoadedImage:
    """An image file loaded: the tag it goes by (its image hash's), its labels, how long it took."""

    tag: str
    labels: dict[str, str]
    seconds: float


async def load_image(images: ImageStore, path: Path, expected_agent: str) -> LoadedImage:
    """Load the image file at ``path`` into ``images``, once its manifest and config show a
    kernelbridge sandbox image with ``expected_agent`` (nothing is loaded otherwise); it is tagged
    with its image hash's tag, where a bridge of the same settings looks for it.

    Raises ImageError (AgentMismatch for another kernelbridge's image), one line.
    """
    started = time.monotonic()
    archive = await anyio.to_thread.run_sync(read_archive, path)
    check_archive(archive, path.name, expected_agent)
    loaded = await images.load(path)
    tag = image_tag(archive.image_hash)
    if tag not in loaded:
        source = next(iter([*archive.tags, *loaded]), None)
        if source is None:
            raise ImageError(f"the engine loaded {path.name} but named no image")
        await images.tag(source, tag)
    labels = await images.labels(tag)
    if labels_status(labels, archive.image_hash) != "current":
        raise ImageError(f"the engine loaded {path.name}, but {tag} is not the image the file holds")
    assert labels is not None
    return LoadedImage(tag, labels, time.monotonic() - started)
