"""What goes into the sandbox image, and what it is called: the recipe side of :mod:`kernelbridge.image`.

The image is named after the **image hash**: a sha256 over every file that goes into the image from
this kernelbridge (the code that runs inside the container, the frame codec, the recipe in
``sandbox_kernel_image/``) plus the operator's choice of packages (:class:`ImageContents`: the
profile and the extra packages). For the default contents (the full profile, no extras) it is the
**agent hash** (files only). The files are this package's own, whatever installed it, so an
installed kernelbridge hashes and builds what a checkout of the same version does. No I/O beyond
reading (and, for :func:`stage_agent`, copying) those files; nothing here talks to a runtime.
Design: docs/design/packages-and-images.md.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbridge import DISTRIBUTION
from kernelbridge.config import DEFAULT_IMAGE_PROFILE, ImageProfile
from kernelbridge.errors import ConfigError, ImageError

if TYPE_CHECKING:
    from kernelbridge.config import Settings

REPOSITORY = "localhost/kernelbridge-sandbox"
INSIDE_PACKAGE = "kernelbridge/inside"
"""The package of the code that runs inside the container: every ``.py`` under it goes into the
image (and into the hash), and the build writes the agent hash into it as ``AGENT_HASH``, where
the agent reads it. The one place that names it."""
AGENT_MODULES = ("kernelbridge/frames.py", "kernelbridge/transitions.py")
"""Host modules the code inside imports (the frame codec and the state tables, stdlib only). The
package ``__init__`` it needs for that is a fixed stub written by the builder (the host's
``__init__`` imports host settings), so that changing a host setting or the bridge never makes an
image stale."""
AGENT_HASH_FILE = "AGENT_HASH"
PACKAGE_STUB = '"""kernelbridge inside the sandbox: the frame codec and the agent only."""\n'
RECIPE_DIR = "sandbox_kernel_image"
"""The recipe's name in the hash (and the top-level directory of a checkout); its files live in the
package as ``kernelbridge/sandbox_kernel_image/``."""
CORE_REQUIREMENTS = "requirements.txt"
ANALYSIS_REQUIREMENTS = "requirements-analysis.txt"
PROFILE_REQUIREMENTS: dict[ImageProfile, tuple[str, ...]] = {
    "full": (CORE_REQUIREMENTS, ANALYSIS_REQUIREMENTS),
    "minimal": (CORE_REQUIREMENTS,),
}
"""The recipe's requirement files each profile installs (a unit test checks every profile of
``config.IMAGE_PROFILES`` is here). Every file is in every image's hash, whichever profile it is."""
RECIPE_FILES = (CORE_REQUIREMENTS, ANALYSIS_REQUIREMENTS, "customize.sh", "Containerfile")
EXTRA_REQUIREMENTS = "extra-requirements.txt"
"""The extras' requirements file as both builders hand it to pip."""
# A requirement line of an extras list: a name, optional extras and a version specifier, nothing
# that pip would read from elsewhere (-r, -e, URLs, paths): the hash must cover what is installed.
# No control characters either: the image hash separates its parts with NUL.
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~][^;#@\x00-\x1f]*)?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def source_root() -> Path:
    """The directory above the ``kernelbridge`` package: a checkout or ``site-packages``."""
    return Path(__file__).resolve().parents[2]


def source_path(root: Path, name: str) -> Path:
    """Where the image file ``name`` (as :func:`image_files` names it) is under ``root``."""
    if name.startswith(f"{RECIPE_DIR}/"):
        return root / "kernelbridge" / name
    return root / name


def recipe_path(root: Path, name: str) -> Path:
    """A recipe file (one of :data:`RECIPE_FILES`) under ``root``."""
    return source_path(root, f"{RECIPE_DIR}/{name}")


def image_files(root: Path | None = None) -> list[str]:
    """Sorted names (POSIX) of every file that goes into the image.

    Raises ImageError when a file is missing (a broken installation).
    """
    root = source_root() if root is None else root
    files = list(AGENT_MODULES)
    package = root / INSIDE_PACKAGE
    files += [
        path.relative_to(root).as_posix()
        for path in package.rglob("*.py")
        if "__pycache__" not in path.relative_to(package).parts
    ]
    files += [f"{RECIPE_DIR}/{name}" for name in RECIPE_FILES]
    missing = [name for name in files if not source_path(root, name).is_file()]
    if missing or not package.is_dir():
        raise ImageError(
            f"this kernelbridge installation is incomplete: {', '.join(missing) or INSIDE_PACKAGE}"
            f" missing under {root}; reinstall it (`pip install --force-reinstall {DISTRIBUTION}`)"
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


# -- the operator's choice: a profile and extra packages ------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImageContents:
    """What an image holds of Python packages: the recipe's requirement files of ``profile`` and the
    operator's extra packages. It names the image (:func:`image_hash`) and says what to install."""

    profile: ImageProfile = DEFAULT_IMAGE_PROFILE
    extras: tuple[str, ...] = ()
    """Requirement specifiers beyond the profile's (``scikit-learn``, ``polars>=1``), in order,
    without duplicates."""

    @property
    def is_default(self) -> bool:
        """The image of the default settings: the one tagged ``:latest``, named by the agent hash."""
        return self.profile == DEFAULT_IMAGE_PROFILE and not self.extras

    @property
    def requirement_files(self) -> tuple[str, ...]:
        """The recipe's requirement files this profile installs (names of :data:`RECIPE_FILES`)."""
        return PROFILE_REQUIREMENTS[self.profile]

    def extras_text(self) -> str:
        """The extras as a requirements file (what the hash covers and pip reads)."""
        return "".join(f"{line}\n" for line in self.extras)

    def extra_names(self) -> list[str]:
        return [normalize_name(line) for line in self.extras]

    def plus(self, more: list[str] | tuple[str, ...]) -> ImageContents:
        """These contents with the extra packages ``more`` (checked like any other), duplicates dropped."""
        lines = list(self.extras)
        for item in more:
            line = check_requirement(item, "--with")
            if line not in lines:
                lines.append(line)
        return ImageContents(self.profile, tuple(lines))

    def with_profile(self, profile: ImageProfile | None) -> ImageContents:
        """These contents with ``profile`` instead (None: unchanged; ``--profile``)."""
        return self if profile is None else ImageContents(profile, self.extras)

    def describe(self) -> str:
        """How messages name these contents: ``the minimal profile with polars``."""
        extras = f" with {' '.join(self.extra_names())}" if self.extras else ""
        return f"the {self.profile} profile{extras}"


DEFAULT_CONTENTS = ImageContents()


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


def contents_from_settings(settings: Settings) -> ImageContents:
    """The image contents of ``KERNELBRIDGE_IMAGE_PROFILE`` and the extras of
    ``KERNELBRIDGE_IMAGE_REQUIREMENTS`` (a file) and ``KERNELBRIDGE_IMAGE_PACKAGES``.

    Raises ConfigError when the file cannot be read or holds something else than requirements.
    """
    lines: list[str] = []
    if settings.image_requirements is not None:
        lines += read_requirements(settings.image_requirements, "KERNELBRIDGE_IMAGE_REQUIREMENTS")
    lines += [check_requirement(item, "KERNELBRIDGE_IMAGE_PACKAGES") for item in settings.image_packages]
    return ImageContents(settings.image_profile).plus(lines)


def image_hash(contents: ImageContents = DEFAULT_CONTENTS, root: Path | None = None) -> str:
    """The hash the image of ``contents`` is named after: the agent hash itself for the default.

    The full profile with extras hashes as it always did (the agent, NUL, the extras); another
    profile adds its name as a part of its own, which no requirement line can spell (no NUL).
    """
    agent = agent_hash(root)
    if contents.is_default:
        return agent
    profile = "" if contents.profile == DEFAULT_IMAGE_PROFILE else f"profile={contents.profile}\0"
    return hashlib.sha256(f"{agent}\0{profile}{contents.extras_text()}".encode()).hexdigest()


def image_tag(hash_: str) -> str:
    """The local image reference for an image hash: ``localhost/kernelbridge-sandbox:<hash[:16]>``."""
    return f"{REPOSITORY}:{hash_[:16]}"


def default_image(contents: ImageContents = DEFAULT_CONTENTS) -> str:
    """The image this kernelbridge expects for ``contents``: the tag of its image hash."""
    return image_tag(image_hash(contents))


def requested_packages(contents: ImageContents, root: Path | None = None) -> list[str]:
    """The names of the packages ``contents`` asks for: its profile's requirement files', then the
    extras (what the ``kernelbridge.packages`` label lists, with versions once installed)."""
    root = source_root() if root is None else root
    names = []
    for name in contents.requirement_files:
        lines = [line.split("#", 1)[0].strip() for line in recipe_path(root, name).read_text().splitlines()]
        names += [normalize_name(line) for line in lines if line]
    return [*names, *contents.extra_names()]


def snapshot(root: Path, dest: Path) -> Path:
    """Copy the image's files from ``root`` to ``dest`` (same layout); returns ``dest``."""
    for name in image_files(root):
        target = source_path(dest, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path(root, name), target)
    return dest


def stage_agent(root: Path, prefix: Path, agent: str) -> None:
    """Copy the code that runs inside under ``prefix`` (it becomes /opt/kernelbridge in the image),
    with the package stub and its ``AGENT_HASH``."""
    for name in image_files(root):
        if name.startswith(f"{RECIPE_DIR}/"):
            continue
        target = prefix / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path(root, name), target)
    (prefix / "kernelbridge" / "__init__.py").write_text(PACKAGE_STUB)
    (prefix / INSIDE_PACKAGE / AGENT_HASH_FILE).write_text(agent + "\n")
