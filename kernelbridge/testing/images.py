"""TEST DOUBLE: an :class:`~kernelbridge.runtime.ImageStore` held in memory.

It behaves as the engines do where the product relies on it (the runtime conformance suite runs
over it too): an import needs a readable tarball and applies ``LABEL`` changes; a build needs its
base image (``FROM``) in the store, the files it ``COPY``s in the context, and applies ``ARG`` and
``LABEL`` lines; a tag names one image; removing a tag an image still has other tags for keeps
the image; an image a container uses is kept (``remove`` returns False). Times of creation come
from a counter, so "newer" is well defined even within one clock tick.
"""

from __future__ import annotations

import hashlib
import itertools
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


def _pairs(text: str, args: Mapping[str, str]) -> dict[str, str]:
    """``k=v k2="a b"`` (a Containerfile LABEL line) with ``$ARG`` substituted."""
    pairs = {}
    for item in shlex.split(text):
        key, _, value = item.partition("=")
        for name, arg in args.items():
            value = value.replace(f"${{{name}}}", arg).replace(f"${name}", arg)
        pairs[key] = value
    return pairs
