"""What an image's labels say: whether it is a kernelbridge sandbox image carrying this
kernelbridge's agent, whether it is current, and which packages it holds.

The builder labels every image ``kernelbridge.agent-hash``, ``kernelbridge.image-hash`` (what
:func:`image_status` compares), ``kernelbridge.profile``, ``kernelbridge.packages`` and
``kernelbridge.version`` (what each holds: docs/design/packages-and-images.md). An explicit
``KERNELBRIDGE_IMAGE`` is used as given; :func:`check_labels` checks it carries this kernelbridge's
agent (a plain ``python:3.14-slim`` gets one line saying how to build one). The labels are read
through the runtime's :class:`~kernelbridge.runtime.ImageStore`, whatever engine that is.
"""

from __future__ import annotations

from typing import Literal

from kernelbridge.errors import AgentMismatch, ImageError
from kernelbridge.image.recipe import DEFAULT_CONTENTS, ImageContents, image_hash
from kernelbridge.runtime.base import AGENT_LABEL, ImageStore

ImageStatus = Literal["current", "stale", "missing"]

HASH_LABEL = AGENT_LABEL
IMAGE_HASH_LABEL = "kernelbridge.image-hash"
PACKAGES_LABEL = "kernelbridge.packages"
PROFILE_LABEL = "kernelbridge.profile"
VERSION_LABEL = "kernelbridge.version"


def check_labels(
    image: str, labels: dict[str, str] | None, expected_agent: str, *, explicit: bool = True
) -> None:
    """Raise ImageError (AgentMismatch for another agent) unless ``labels`` (of ``image``; None: no
    such image) describe a kernelbridge sandbox image with the agent ``expected_agent``. One line
    each, with the fix; ``explicit``: the image was named by ``KERNELBRIDGE_IMAGE`` (the fix then
    involves that setting)."""
    build = "run `kernelbridge image build`"
    if explicit:
        build = (
            "build one with `kernelbridge image build` and unset KERNELBRIDGE_IMAGE"
            " (or set it to the tag the build prints)"
        )
    if labels is None:
        raise ImageError(f"the sandbox image {image} is missing; {build}")
    found = labels.get(HASH_LABEL)
    if not found:
        raise ImageError(
            f"{image} is not a kernelbridge sandbox image (it has no {HASH_LABEL} label, so it has no"
            f" kernelbridge agent to talk to); {build}"
        )
    if found != expected_agent:
        built_by = labels.get(VERSION_LABEL, "another version")
        rebuild = "rebuild it with `kernelbridge image build`" + (
            " and use the tag it prints" if explicit else ""
        )
        raise AgentMismatch(
            f"{image} carries the agent of kernelbridge {built_by} ({found[:12]}) but this kernelbridge"
            f" expects {expected_agent[:12]} (they may not speak the same frames); {rebuild}"
        )


def packages_label(installed: dict[str, str], wanted: list[str]) -> str:
    """The ``kernelbridge.packages`` label: ``name==version`` of each wanted package, space-separated."""
    return " ".join(f"{name}=={installed[name]}" for name in dict.fromkeys(wanted) if name in installed)


def parse_packages(label: str | None) -> list[str]:
    """The ``name==version`` items of a ``kernelbridge.packages`` label (empty for older images)."""
    return [item for item in (label or "").split() if "==" in item]


async def image_status(
    images: ImageStore, image: str, contents: ImageContents = DEFAULT_CONTENTS
) -> ImageStatus:
    """``current`` if ``image`` exists in ``images`` and is the image of this kernelbridge and
    ``contents``, ``stale`` if it is another one, ``missing`` if there is no such image.
    Raises RuntimeUnavailable when the engine cannot be asked."""
    return labels_status(await images.labels(image), image_hash(contents))


def labels_status(labels: dict[str, str] | None, hash_: str) -> ImageStatus:
    """The status of an image with ``labels`` (None: missing) for the image hash ``hash_``."""
    if labels is None:
        return "missing"
    # Images built before the image-hash label existed had no extras: their agent hash is it.
    found = labels.get(IMAGE_HASH_LABEL) or labels.get(HASH_LABEL)
    return "current" if found == hash_ else "stale"
