"""The sandbox image: what goes into it, its name, whether the local copy is current, and whether
an image someone names is a kernelbridge image at all. The build itself is
:mod:`kernelbridge.image_build`.

The image is named after the **image hash**: a sha256 over every file that goes into the image from
this kernelbridge (the agent, the modules it imports, and the recipe in ``sandbox_kernel_image/``)
plus the operator's extra packages (``kernelbridge image build --with``,
``KERNELBRIDGE_IMAGE_PACKAGES``, ``KERNELBRIDGE_IMAGE_REQUIREMENTS``). Without extras the image
hash is the **agent hash** (files only), so the usual image keeps its usual name.

Labels of every image this module builds:

=============================  =====================================================================
``kernelbridge.agent-hash``    the agent hash; the agent also holds it in ``sandbox/AGENT_HASH`` and
                               refuses a host expecting another agent
``kernelbridge.image-hash``    the image hash (agent + extras): what :func:`image_status` compares
``kernelbridge.packages``      the requested Python packages with their installed versions, read by
                               the bridge for the capabilities the model reads
``kernelbridge.version``       the kernelbridge version that built it (for messages only)
=============================  =====================================================================

Where the files come from: this package's own directory, whatever installed it. The recipe is
package data, ``kernelbridge/sandbox_kernel_image/``; in a checkout that is a symlink to the
top-level ``sandbox_kernel_image/`` that people edit (a wheel or sdist copies the files, so an
installed kernelbridge hashes and builds exactly what a checkout of the same version does). The
hash names recipe files ``sandbox_kernel_image/<file>`` in either case.

An explicit ``KERNELBRIDGE_IMAGE`` is used as given; :func:`check_labels` checks it is a
kernelbridge image carrying this kernelbridge's agent (a plain ``python:3.14-slim`` gets one line
saying how to build one).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from kernelbridge.errors import AgentMismatch, ConfigError, ImageError

if TYPE_CHECKING:
    from kernelbridge.config import Settings

__all__ = [
    "HASH_LABEL",
    "IMAGE_HASH_LABEL",
    "NO_EXTRAS",
    "PACKAGES_LABEL",
    "REPOSITORY",
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
]

ImageStatus = Literal["current", "stale", "missing"]
Log = Callable[[str], None]

REPOSITORY = "localhost/kernelbridge-sandbox"
HASH_LABEL = "kernelbridge.agent-hash"
IMAGE_HASH_LABEL = "kernelbridge.image-hash"
PACKAGES_LABEL = "kernelbridge.packages"
VERSION_LABEL = "kernelbridge.version"

# What goes into the image from the package, relative to the directory above it: only code that
# runs in the sandbox, so that changing a host setting or the bridge never makes an image stale.
# The agent imports ``kernelbridge.frames`` (stdlib only); the package ``__init__`` it needs for
# that is a fixed stub written by the builder (the host's ``__init__`` imports host settings).
AGENT_MODULES = ("kernelbridge/frames.py",)
AGENT_PACKAGE = "kernelbridge/inside"
AGENT_HASH_FILE = "AGENT_HASH"
# The recipe's name in the hash (and the top-level directory of a checkout); its files live in the
# package as ``kernelbridge/sandbox_kernel_image/``.
RECIPE_DIR = "sandbox_kernel_image"
RECIPE_FILES = ("requirements.txt", "customize.sh", "Containerfile")
# Bounds on the runtime CLI calls that are not builds: they answer in well under a second.
INSPECT_TIMEOUT = 30.0
# A requirement line of an extras list: a name, optional extras and a version specifier, nothing
# that pip would read from elsewhere (-r, -e, URLs, paths): the hash must cover what is installed.
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~][^;#@]*)?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


# -- what goes into the image ------------------------------------------------------------------------
def source_root() -> Path:
    """The directory above the ``kernelbridge`` package: a checkout or ``site-packages``."""
    return Path(__file__).resolve().parent.parent


def source_path(root: Path, name: str) -> Path:
    """Where the image file ``name`` (as :func:`image_files` names it) is under ``root``."""
    if name.startswith(f"{RECIPE_DIR}/"):
        return root / "kernelbridge" / name
    return root / name


def recipe_path(root: Path, name: str) -> Path:
    """A recipe file (``requirements.txt``, ``customize.sh``, ``Containerfile``) under ``root``."""
    return source_path(root, f"{RECIPE_DIR}/{name}")


def image_files(root: Path | None = None) -> list[str]:
    """Sorted names (POSIX) of every file that goes into the image.

    Raises ImageError when a file is missing (a broken installation).
    """
    root = source_root() if root is None else root
    files = list(AGENT_MODULES)
    package = root / AGENT_PACKAGE
    files += [
        path.relative_to(root).as_posix()
        for path in package.rglob("*.py")
        if "__pycache__" not in path.relative_to(package).parts
    ]
    files += [f"{RECIPE_DIR}/{name}" for name in RECIPE_FILES]
    missing = [name for name in files if not source_path(root, name).is_file()]
    if missing or not package.is_dir():
        raise ImageError(
            f"this kernelbridge installation is incomplete: {', '.join(missing) or AGENT_PACKAGE}"
            f" missing under {root}; reinstall kernelbridge (`pip install --force-reinstall kernelbridge`)"
        )
    return sorted(set(files))


def agent_hash(root: Path | None = None) -> str:
    """The sha256 (hex) of the image's files: their names and contents, sorted.

    Each file contributes its name, a NUL, its length and its bytes, so no two trees collide by
    moving bytes across a file boundary.
    """
    root = source_root() if root is None else root
    digest = hashlib.sha256()
    for name in image_files(root):
        data = source_path(root, name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


# -- extra packages ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImageExtras:
    """Python packages an operator adds to the image, beyond ``sandbox_kernel_image/requirements.txt``."""

    requirements: tuple[str, ...] = ()
    """Requirement specifiers (``scikit-learn``, ``polars>=1``), in order, without duplicates."""

    def __bool__(self) -> bool:
        return bool(self.requirements)

    def text(self) -> str:
        """The extras as a requirements file (what the hash covers and pip reads)."""
        return "".join(f"{line}\n" for line in self.requirements)

    def names(self) -> list[str]:
        return [normalize_name(line) for line in self.requirements]

    def plus(self, more: list[str] | tuple[str, ...]) -> ImageExtras:
        """These extras and ``more`` (checked like any other), duplicates dropped."""
        lines = list(self.requirements)
        for item in more:
            line = check_requirement(item, "--with")
            if line not in lines:
                lines.append(line)
        return ImageExtras(tuple(lines))


NO_EXTRAS = ImageExtras()


def normalize_name(requirement: str) -> str:
    """The PEP 503 name of a requirement line (``Scikit_Learn>=1`` -> ``scikit-learn``)."""
    match = _NAME.match(requirement.strip())
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else requirement


def check_requirement(line: str, where: str) -> str:
    """``line`` stripped, if it is a plain requirement specifier; ConfigError naming ``where``."""
    line = line.strip()
    if not _REQUIREMENT.match(line):
        raise ConfigError(
            f"{where}: {line!r} is not a package requirement such as scikit-learn or polars>=1"
            " (options, URLs, paths and includes are not accepted: the image's name must cover"
            " exactly what it installs)"
        )
    return line


def read_requirements(path: Path, where: str) -> list[str]:
    """The requirement lines of a requirements file (comments and blank lines skipped)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{where}={path}: cannot read it ({exc.strerror})") from None
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [check_requirement(line, f"{where} ({path})") for line in lines if line]


def extras_from_settings(settings: Settings) -> ImageExtras:
    """The extras of ``KERNELBRIDGE_IMAGE_REQUIREMENTS`` (a file) and ``KERNELBRIDGE_IMAGE_PACKAGES``.

    Raises ConfigError when the file cannot be read or holds something else than requirements.
    """
    lines: list[str] = []
    if settings.image_requirements is not None:
        lines += read_requirements(settings.image_requirements, "KERNELBRIDGE_IMAGE_REQUIREMENTS")
    return ImageExtras().plus(lines + list(settings.image_packages))


def image_hash(extras: ImageExtras = NO_EXTRAS, root: Path | None = None) -> str:
    """The hash the image of ``extras`` is named after: the agent hash itself without extras."""
    agent = agent_hash(root)
    if not extras:
        return agent
    return hashlib.sha256(f"{agent}\0{extras.text()}".encode()).hexdigest()


def image_tag(hash_: str) -> str:
    """The local image reference for an image hash: ``localhost/kernelbridge-sandbox:<hash[:16]>``."""
    return f"{REPOSITORY}:{hash_[:16]}"


def default_image(extras: ImageExtras = NO_EXTRAS) -> str:
    """The image this kernelbridge expects for ``extras``: the tag of its image hash."""
    return image_tag(image_hash(extras))


# -- labels ----------------------------------------------------------------------------------------------
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


def base_requirements(root: Path | None = None) -> list[str]:
    """The names of the packages of the recipe's ``requirements.txt``."""
    root = source_root() if root is None else root
    lines = [
        line.split("#", 1)[0].strip()
        for line in recipe_path(root, "requirements.txt").read_text().splitlines()
    ]
    return [normalize_name(line) for line in lines if line]


# -- the local copy ------------------------------------------------------------------------------------
def image_labels(executable: str, image: str) -> dict[str, str] | None:
    """The labels of ``image`` (podman or docker ``image inspect``), or None when there is no such image.

    Raises ImageError when the runtime cannot be run at all.
    """
    try:
        proc = subprocess.run(
            [executable, "image", "inspect", image],
            capture_output=True,
            text=True,
            timeout=INSPECT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageError(
            f"cannot inspect images with {executable!r} ({exc}); check that it is installed and works"
            " (`kernelbridge doctor`)"
        ) from exc
    if proc.returncode != 0:
        if "cannot connect" in proc.stderr.lower() or "daemon running" in proc.stderr.lower():
            raise ImageError(f"{executable} cannot reach its daemon: {proc.stderr.strip().splitlines()[-1]}")
        return None
    try:
        (info,) = json.loads(proc.stdout)
    except ValueError:
        return None
    # podman puts the labels at top level and under Config; docker only under Config.
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    return {str(key): str(value) for key, value in labels.items()}


def image_status(executable: str, image: str, extras: ImageExtras = NO_EXTRAS) -> ImageStatus:
    """``current`` if ``image`` exists and is the image of this kernelbridge and ``extras``,
    ``stale`` if it is another one, ``missing`` if there is no such image."""
    return labels_status(image_labels(executable, image), image_hash(extras))


def labels_status(labels: dict[str, str] | None, hash_: str) -> ImageStatus:
    """The status of an image with ``labels`` (None: missing) for the image hash ``hash_``."""
    if labels is None:
        return "missing"
    # Images built before the image-hash label existed had no extras: their agent hash is it.
    found = labels.get(IMAGE_HASH_LABEL) or labels.get(HASH_LABEL)
    return "current" if found == hash_ else "stale"


def ensure_image(executable: str = "podman", *, log: Log = print, extras: ImageExtras = NO_EXTRAS) -> str:
    """Return the tag of the current image, building it first only when it is missing or stale."""
    return build_image(executable, force=False, log=log, extras=extras)


def build_image(
    executable: str = "podman",
    *,
    force: bool = False,
    log: Log = print,
    containerfile: bool = False,
    root: Path | None = None,
    extras: ImageExtras = NO_EXTRAS,
) -> str:
    """Build the sandbox image (see :func:`kernelbridge.image_build.build_image`); returns its tag."""
    from kernelbridge.image_build import build_image as build

    return build(executable, force=force, log=log, containerfile=containerfile, root=root, extras=extras)


def main(argv: list[str] | None = None) -> int:
    """``python -m kernelbridge.image``: see :func:`kernelbridge.image_build.main`."""
    from kernelbridge.image_build import main as build_main

    return build_main(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
