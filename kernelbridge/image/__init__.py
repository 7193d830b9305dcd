"""The sandbox image: what goes into it and its name (``recipe``), what its labels say
(``labels``), how it is built without a registry (``rootfs``, ``containerfile``, ``build``).

Every image chore goes through the selected runtime's :class:`~kernelbridge.runtime.ImageStore`
(``runtime.images``): this package never runs a container CLI itself, so a remote engine, docker or
several engines build and check their image like a local podman. ``python -m kernelbridge.image``
builds it from a shell (``scripts/setup.sh``, ``make image``).
"""

from kernelbridge.image.build import build_image, ensure_image
from kernelbridge.image.labels import (
    HASH_LABEL,
    IMAGE_HASH_LABEL,
    PACKAGES_LABEL,
    VERSION_LABEL,
    ImageStatus,
    check_labels,
    image_status,
    labels_status,
    packages_label,
    parse_packages,
)
from kernelbridge.image.recipe import (
    INSIDE_PACKAGE,
    NO_EXTRAS,
    RECIPE_FILES,
    REPOSITORY,
    ImageExtras,
    agent_hash,
    default_image,
    extras_from_settings,
    image_files,
    image_hash,
    image_tag,
    source_path,
)

__all__ = [
    "HASH_LABEL",
    "IMAGE_HASH_LABEL",
    "INSIDE_PACKAGE",
    "NO_EXTRAS",
    "PACKAGES_LABEL",
    "RECIPE_FILES",
    "REPOSITORY",
    "VERSION_LABEL",
    "ImageExtras",
    "ImageStatus",
    "agent_hash",
    "build_image",
    "check_labels",
    "default_image",
    "ensure_image",
    "extras_from_settings",
    "image_files",
    "image_hash",
    "image_status",
    "image_tag",
    "labels_status",
    "packages_label",
    "parse_packages",
    "source_path",
]
