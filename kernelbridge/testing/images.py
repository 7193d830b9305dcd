"""TEST DOUBLE: an :class:`~kernelbridge.runtime.ImageStore` held in memory.

It behaves as the engines do where the product relies on it (the runtime conformance suite runs
over it too): an import needs a readable tarball and applies ``LABEL`` changes; a build needs its
base image (``FROM``) in the store, the files it ``COPY``s in the context, and applies ``ARG`` and
``LABEL`` lines; a tag names one image; removing a tag an image still has other tags for keeps
the image; an image a container uses is kept (``remove`` returns False); ``save`` writes a
docker-archive (``manifest.json``, the config with the labels, one empty layer) that ``load``
reads back, refusing a file without a whole manifest, config and layers as the engines do. Times
of creation come from a counter, so "newer" is well defined even within one clock tick.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import itertools
import json
import shlex
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from kernelbridge.errors import ImageError
from kernelbridge.runtime.base import ImageInfo, ImageStore


@dataclass
class _Image:
    id: str
    labels: dict[str, str]
    created: float


@dataclass
class MemoryImages(ImageStore):
    """Images in a dict. ``in_use`` says which references containers use (kept on removal)."""

    in_use: Callable[[], set[str]] = set
    _images: dict[str, _Image] = field(default_factory=dict)
    _tags: dict[str, str] = field(default_factory=dict)
    """tag -> image id."""
    _clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _find(self, ref: str) -> _Image | None:
        return self._images.get(self._tags.get(ref, ref))

    def _add(self, labels: dict[str, str], seed: bytes) -> _Image:
        created = float(next(self._clock))
        digest = hashlib.sha256(seed + str(created).encode()).hexdigest()
        image = _Image(f"sha256:{digest}", labels, created)
        self._images[image.id] = image
        return image

    async def labels(self, image: str) -> dict[str, str] | None:
        found = self._find(image)
        return None if found is None else dict(found.labels)

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        try:
            if not await anyio.to_thread.run_sync(tarfile.is_tarfile, tarball):
                raise ImageError(f"importing {tag} failed: {tarball} is not a tarball")
            data = await anyio.Path(tarball).read_bytes()
        except OSError as exc:
            raise ImageError(f"cannot read {tarball}: {exc.strerror}") from None
        labels: dict[str, str] = {}
        for change in changes:
            instruction, _, rest = change.partition(" ")
            if instruction.upper() == "LABEL":
                labels.update(_pairs(rest, {}))
        self._tags[tag] = self._add(labels, data + "\0".join(changes).encode()).id

    async def tag(self, image: str, tag: str) -> None:
        found = self._find(image)
        if found is None:
            raise ImageError(f"tagging {image} as {tag} failed: no such image")
        self._tags[tag] = found.id

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> list[ImageInfo]:
        found = []
        for image in self._images.values():
            if not all(
                k in image.labels and (not v or image.labels[k] == v) for k, v in (labels or {}).items()
            ):
                continue
            tags = tuple(sorted(t for t, i in self._tags.items() if i == image.id))
            info = ImageInfo(image.id, tags, image.created, dict(image.labels))
            if not repository or info.in_repository(repository):
                found.append(info)
        return found

    async def remove(self, image: str) -> bool:
        found = self._find(image)
        if found is None:
            return True
        tags = {t for t, i in self._tags.items() if i == found.id}
        if image in tags and len(tags) > 1:
            del self._tags[image]  # untagged; the image keeps its other names
            return True
        if self.in_use() & (tags | {found.id}):
            return False
        for tag in tags:
            del self._tags[tag]
        del self._images[found.id]
        return True

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: str = "Containerfile",
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        try:
            lines = (await anyio.Path(context / containerfile).read_text()).splitlines()
        except OSError as exc:
            raise ImageError(f"building {tag} failed: cannot read {containerfile} ({exc.strerror})") from None
        args = dict(build_args or {})
        labels: dict[str, str] | None = None
        for line in lines:
            instruction, _, rest = line.strip().partition(" ")
            instruction = instruction.upper()
            if instruction == "FROM":
                base = self._find(rest.split()[0])
                if base is None:
                    raise ImageError(f"building {tag} failed: base image {rest.split()[0]} is missing")
                labels = dict(base.labels)
            elif labels is None and instruction not in ("", "ARG") and not instruction.startswith("#"):
                raise ImageError(f"building {tag} failed: {instruction} before FROM")
            elif instruction == "ARG":
                name, _, default = rest.partition("=")
                args.setdefault(name.strip(), default)
            elif instruction == "LABEL" and labels is not None:
                labels.update(_pairs(rest, args))
            elif instruction in ("COPY", "ADD") and "--from=" not in rest:  # not from another stage
                for source in [word for word in shlex.split(rest)[:-1] if not word.startswith("--")]:
                    if not (context / source).exists():
                        raise ImageError(f"building {tag} failed: {source} is not in the build context")
        if labels is None:
            raise ImageError(f"building {tag} failed: {containerfile} has no FROM")
        self._tags[tag] = self._add(labels, "\n".join(lines).encode()).id

    async def save(self, image: str, archive: Path) -> None:
        found = self._find(image)
        if found is None:
            raise ImageError(f"saving {image} failed: no such image")
        config = f"{found.id.removeprefix('sha256:')}.json"
        tags = [image] if image in self._tags else []
        manifest = [{"Config": config, "RepoTags": tags, "Layers": ["layer.tar"]}]
        files = {
            "layer.tar": _empty_tar(),
            config: json.dumps({"config": {"Labels": found.labels}}).encode(),
            "manifest.json": json.dumps(manifest).encode(),
        }
        await anyio.to_thread.run_sync(_write_tar, archive, files)

    async def load(self, archive: Path) -> builtins.list[str]:
        try:
            entries = await anyio.to_thread.run_sync(_read_archive, archive)
        except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as exc:
            raise ImageError(f"loading {archive.name} failed: not a whole image archive ({exc})") from None
        loaded = []
        for labels, tags in entries:
            image = self._add(labels, archive.name.encode())
            for tag in tags:
                self._tags[tag] = image.id
            loaded += tags or [image.id]
        return loaded


def _empty_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w"):
        pass
    return buffer.getvalue()


def _write_tar(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _read_archive(path: Path) -> list[tuple[dict[str, str], list[str]]]:
    """(labels, tags) of each image of an (uncompressed) docker-archive; raises on anything
    missing or cut short."""
    with tarfile.open(path, "r:") as tar:
        members = {member.name: member for member in tar.getmembers()}
        size = path.stat().st_size
        if any(m.offset_data + m.size > size for m in members.values()):
            raise ValueError("cut short")

        def read(name: str) -> bytes:
            file = tar.extractfile(members[name])
            if file is None:
                raise ValueError(f"{name} is not a file")
            return file.read()

        entries = []
        for entry in json.loads(read("manifest.json")):
            for layer in entry["Layers"]:
                read(layer)
            labels = json.loads(read(entry["Config"]))["config"].get("Labels") or {}
            entries.append(({str(k): str(v) for k, v in labels.items()}, list(entry.get("RepoTags") or [])))
        return entries


def _pairs(text: str, args: Mapping[str, str]) -> dict[str, str]:
    """``k=v k2="a b"`` (a Containerfile LABEL line) with ``$ARG`` substituted."""
    pairs = {}
    for item in shlex.split(text):
        key, _, value = item.partition("=")
        for name, arg in args.items():
            value = value.replace(f"${{{name}}}", arg).replace(f"${name}", arg)
        pairs[key] = value
    return pairs
