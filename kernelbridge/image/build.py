"""Building the sandbox image into the runtime's :class:`~kernelbridge.runtime.ImageStore`.

The image goes into the store of the selected runtime, whatever it is (podman or docker, through
its API or its CLI, local or remote, or every engine of a set). The default builder needs no
container registry (:mod:`kernelbridge.image.rootfs`); ``containerfile=True`` builds the recipe's
Containerfile on the engine instead; both make the same layout. The image of the default contents
(the full profile, no extras) is also tagged ``:latest``, and older images of other hashes are
pruned (the newest :data:`KEEP_IMAGES` kept). One build at a time per user (a lock file).
Design: docs/design/packages-and-images.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from kernelbridge import __version__
from kernelbridge.errors import ImageError
from kernelbridge.image.containerfile import build_args, import_changes, stage_context
from kernelbridge.image.labels import (
    HASH_LABEL,
    IMAGE_HASH_LABEL,
    PROFILE_LABEL,
    VERSION_LABEL,
    labels_status,
)
from kernelbridge.image.recipe import (
    DEFAULT_CONTENTS,
    REPOSITORY,
    ImageContents,
    agent_hash,
    image_hash,
    image_tag,
    recipe_path,
    snapshot,
    source_root,
)
from kernelbridge.image.rootfs import Log, make_rootfs, step
from kernelbridge.runtime.base import ImageStore

LATEST = f"{REPOSITORY}:latest"
KEEP_IMAGES = 4
"""Images of other hashes kept after a build (newest first): neighbouring versions or checkouts on
the same machine may still use them; older ones are removed to bound disk use."""
LOCK_POLL = 0.5
"""How often a build waiting for another one's lock tries again (builds take a minute)."""


async def build_image(
    images: ImageStore,
    *,
    force: bool = False,
    log: Log = print,
    containerfile: bool = False,
    root: Path | None = None,
    contents: ImageContents = DEFAULT_CONTENTS,
) -> str:
    """Build the sandbox image of this kernelbridge and ``contents`` into ``images``; its tag.

    Without ``force``, an image that is already current is kept.
    Raises ImageError, with a one-line cause and fix, when a tool is missing or a step fails, and
    RuntimeUnavailable when the engine cannot be reached.
    """
    root = source_root() if root is None else root
    with tempfile.TemporaryDirectory(prefix="kernelbridge-image-") as tmp:
        work = Path(tmp)
        # Build from a snapshot: the tree may change during the minute a build takes (an editor
        # saving, a checkout), and the label must describe what the image really holds.
        source = await anyio.to_thread.run_sync(snapshot, root, work / "source")
        hash_ = image_hash(contents, source)
        tag = image_tag(hash_)
        if not force and labels_status(await images.labels(tag), hash_) == "current":
            log(f"sandbox image {tag} is current")
            if contents.is_default:
                await _point_latest_at(images, tag, hash_)
            return tag
        async with _build_lock(log):
            # Whoever held the lock may just have built this very image.
            if not force and labels_status(await images.labels(tag), hash_) == "current":
                log(f"sandbox image {tag} is current")
                return tag
            started = time.monotonic()
            labels = {
                HASH_LABEL: agent_hash(source),
                IMAGE_HASH_LABEL: hash_,
                VERSION_LABEL: __version__,
                PROFILE_LABEL: contents.profile,
            }
            if containerfile:
                await _build_from_containerfile(images, source, work / "context", labels, tag, log, contents)
            else:
                tarball = await make_rootfs(source, work, labels, contents, log)
                with step(log, "import the root file system"):
                    changes = import_changes(recipe_path(source, "Containerfile"), labels)
                    await images.import_rootfs(tarball, tag, changes)
            if contents.is_default:
                await _point_latest_at(images, tag, hash_)
            await _remove_other_images(images, tag, log)
            log(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


async def ensure_image(
    images: ImageStore, *, log: Log = print, contents: ImageContents = DEFAULT_CONTENTS
) -> str:
    """The tag of the current image in ``images``, building it first only when it is missing or stale."""
    return await build_image(images, force=False, log=log, contents=contents)


async def _build_from_containerfile(
    images: ImageStore,
    root: Path,
    context: Path,
    labels: dict[str, str],
    tag: str,
    log: Log,
    contents: ImageContents,
) -> None:
    """The recipe's Containerfile, built by the engine from a context holding only what it copies."""
    with step(log, "stage the build context"):
        stage_context(root, context, labels[HASH_LABEL], contents)
    with step(log, "build the Containerfile"):
        try:
            await images.build(context, tag, build_args=build_args(root, labels, contents))
        except ImageError as exc:
            raise ImageError(f"{exc}; check that the registry is reachable") from None


async def _point_latest_at(images: ImageStore, tag: str, hash_: str) -> None:
    """Tag ``tag`` as ``:latest`` unless it already is: ``:latest`` names the plain image this
    kernelbridge uses, even when another source tree on the machine built (and tagged) since."""
    if labels_status(await images.labels(LATEST), hash_) != "current":
        await images.tag(tag, LATEST)


async def _remove_other_images(images: ImageStore, keep: str, log: Log) -> None:
    """Remove older images of other hashes, keeping the newest :data:`KEEP_IMAGES` (a bridge or
    checkout of a neighbouring version may still start sandboxes from them) and any image still
    used by a container; untagged leftovers of ``--force`` rebuilds go too."""
    tagged = [
        (image.created, ref)
        for image in await images.list(REPOSITORY)
        for ref in image.tags
        if ref.rpartition(":")[0] == REPOSITORY and ref not in (keep, LATEST)
    ]
    stale = [ref for _, ref in sorted(tagged, reverse=True)[KEEP_IMAGES:]]
    # A rebuild under the same tag (--force) leaves the previous image untagged.
    untagged = [image.id for image in await images.list(labels={HASH_LABEL: ""}) if not image.tags]
    for ref in stale + untagged:
        removed = await images.remove(ref)
        log(f"removed old image {ref}" if removed else f"kept old image {ref} (in use)")


@contextlib.asynccontextmanager
async def _build_lock(log: Log) -> AsyncIterator[None]:
    """One build at a time per user: parallel test runs or a `make setup` beside a test session would
    otherwise each spend a minute building the same image and race on its tags."""
    path = Path(tempfile.gettempdir()) / f"kernelbridge-image-build-{os.getuid()}.lock"
    with path.open("a") as file:
        waiting = False
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    log("waiting for another build of the sandbox image ...")
                    waiting = True
                await anyio.sleep(LOCK_POLL)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
