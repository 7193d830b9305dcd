"""The sandbox image: what goes into it and its name (``recipe``), what its labels say
(``labels``), how it is built without a registry (``rootfs``, ``containerfile``, ``build``).

Every image chore goes through the selected runtime's :class:`~kernelbridge.runtime.ImageStore`
(``runtime.images``): this package never runs a container CLI itself, so a remote engine, docker or
several engines build and check their image like a local podman. ``python -m kernelbridge.image``
builds it from a shell (``scripts/setup.sh``, ``make image``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.image.build import build_image, ensure_image
    from kernelbridge.image.labels import (
        HASH_LABEL,
        IMAGE_HASH_LABEL,
        PACKAGES_LABEL,
        PROFILE_LABEL,
        VERSION_LABEL,
        ImageStatus,
        check_labels,
        image_status,
        labels_status,
        packages_label,
        parse_packages,
    )
    from kernelbridge.image.recipe import (
        DEFAULT_CONTENTS,
        INSIDE_PACKAGE,
        PROFILE_REQUIREMENTS,
        RECIPE_FILES,
        REPOSITORY,
        ImageContents,
        agent_hash,
        contents_from_settings,
        default_image,
        image_files,
        image_hash,
        image_tag,
        source_path,
    )

__all__ = [
    "DEFAULT_CONTENTS",
    "HASH_LABEL",
    "IMAGE_HASH_LABEL",
    "INSIDE_PACKAGE",
    "PACKAGES_LABEL",
    "PROFILE_LABEL",
    "PROFILE_REQUIREMENTS",
    "RECIPE_FILES",
    "REPOSITORY",
    "VERSION_LABEL",
    "ImageContents",
    "ImageStatus",
    "agent_hash",
    "build_image",
    "check_labels",
    "contents_from_settings",
    "default_image",
    "ensure_image",
    "image_files",
    "image_hash",
    "image_status",
    "image_tag",
    "labels_status",
    "packages_label",
    "parse_packages",
    "source_path",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
