"""What both builders read from the recipe's Containerfile, the one source of truth of the image's
configuration, and what the Containerfile builder hands to the engine.

- the registry-free builder imports a root file system and applies the Containerfile's ``ENV``,
  ``WORKDIR`` and ``CMD`` lines (and the labels) as import changes (:func:`import_changes`);
- ``kernelbridge image build --containerfile`` stages a build context with only what the
  Containerfile copies (:func:`stage_context`) and builds it with :func:`build_args`.

No runtime here: the builds go through the runtime's ImageStore (:mod:`kernelbridge.image.build`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kernelbridge import __version__
from kernelbridge.image.labels import HASH_LABEL, IMAGE_HASH_LABEL
from kernelbridge.image.recipe import (
    EXTRA_REQUIREMENTS,
    RECIPE_FILES,
    ImageContents,
    recipe_path,
    requested_packages,
    stage_agent,
)

AGENT_PREFIX = "opt/kernelbridge"
"""Where the code that runs inside goes in the image (and in a build context)."""
IMPORTED = ("ENV", "WORKDIR", "CMD")
"""The Containerfile instructions an import applies (the others build the root file system)."""


def import_changes(containerfile: Path, labels: dict[str, str]) -> list[str]:
    """The changes of an import: the Containerfile's ENV, WORKDIR and CMD lines (one source of
    truth for both builders; each on one line) and the labels."""
    changes = [
        line.strip() for line in containerfile.read_text().splitlines() if line.split(" ", 1)[0] in IMPORTED
    ]
    # podman import splits a change on its first space and takes the rest as `key=value`: values
    # with spaces (the packages label) must be quoted as in a Containerfile.
    return [*changes, *(f"LABEL {key}={json_quote(value)}" for key, value in labels.items())]


def json_quote(value: str) -> str:
    """A label value as a Containerfile accepts it: bare when it has no space or quote."""
    if value and not any(ch in value for ch in ' "\\\t'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stage_context(root: Path, context: Path, agent: str, contents: ImageContents) -> Path:
    """A build context holding only what the Containerfile copies: the recipe, the extras'
    requirements and the code that runs inside (with its agent hash). Returns ``context``."""
    context.mkdir(parents=True, exist_ok=True)
    for name in RECIPE_FILES:
        shutil.copyfile(recipe_path(root, name), context / name)
    (context / EXTRA_REQUIREMENTS).write_text(contents.extras_text())
    stage_agent(root, context / AGENT_PREFIX, agent)
    return context


def build_args(root: Path, labels: dict[str, str], contents: ImageContents) -> dict[str, str]:
    """The Containerfile's ``ARG`` values: the profile and the recipe's requirement files it installs
    (named here, not in the Containerfile: ``recipe.PROFILE_REQUIREMENTS`` is the one mapping), and
    its label values (package names only: the versions pip picks are not known before the build)."""
    return {
        "AGENT_HASH": labels[HASH_LABEL],
        "IMAGE_HASH": labels[IMAGE_HASH_LABEL],
        "KERNELBRIDGE_VERSION": __version__,
        "PROFILE": contents.profile,
        "REQUIREMENTS": " ".join(contents.requirement_files),
        "PACKAGES": " ".join(requested_packages(contents, root)),
    }
