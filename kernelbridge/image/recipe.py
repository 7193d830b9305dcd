"""What goes into the sandbox image, and what it is called: the recipe side of :mod:`kernelbridge.image`.

The image is named after the **image hash**: a sha256 over every file that goes into the image from
this kernelbridge (the code that runs inside the container, the frame codec it imports, and the
recipe in ``sandbox_kernel_image/``) plus the operator's extra packages (``kernelbridge image build
--with``, ``KERNELBRIDGE_IMAGE_PACKAGES``, ``KERNELBRIDGE_IMAGE_REQUIREMENTS``). Without extras the
image hash is the **agent hash** (files only), so the usual image keeps its usual name.

Where the files come from: this package's own directory, whatever installed it. The recipe is
package data, ``kernelbridge/sandbox_kernel_image/``; in a checkout that is a symlink to the
top-level ``sandbox_kernel_image/`` that people edit (a wheel or sdist copies the files, so an
installed kernelbridge hashes and builds exactly what a checkout of the same version does). The
hash names recipe files ``sandbox_kernel_image/<file>`` in either case. No I/O beyond reading (and,
for :func:`stage_agent`, copying) those files; nothing here talks to a runtime.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbridge import DISTRIBUTION
from kernelbridge.errors import ConfigError, ImageError

if TYPE_CHECKING:
    from kernelbridge.config import Settings

REPOSITORY = "localhost/kernelbridge-sandbox"
INSIDE_PACKAGE = "kernelbridge/inside"
"""The package of the code that runs inside the container: every ``.py`` under it goes into the
image (and into the hash), and the build writes the agent hash into it as ``AGENT_HASH``, where
the agent reads it. The one place that names it."""
AGENT_MODULES = ("kernelbridge/frames.py",)
"""Host modules the code inside imports (the frame codec, stdlib only). The package ``__init__``
it needs for that is a fixed stub written by the builder (the host's ``__init__`` imports host
settings), so that changing a host setting or the bridge never makes an image stale."""
AGENT_HASH_FILE = "AGENT_HASH"
PACKAGE_STUB = '"""kernelbridge inside the sandbox: the frame codec and the agent only."""\n'
RECIPE_DIR = "sandbox_kernel_image"
"""The recipe's name in the hash (and the top-level directory of a checkout); its files live in the
package as ``kernelbridge/sandbox_kernel_image/``."""
RECIPE_FILES = ("requirements.txt", "customize.sh", "Containerfile")
EXTRA_REQUIREMENTS = "extra-requirements.txt"
"""The extras' requirements file as both builders hand it to pip."""
# A requirement line of an extras list: a name, optional extras and a version specifier, nothing
# that pip would read from elsewhere (-r, -e, URLs, paths): the hash must cover what is installed.
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~][^;#@]*)?$")
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
    """A recipe file (``requirements.txt``, ``customize.sh``, ``Containerfile``) under ``root``."""
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


def base_requirements(root: Path | None = None) -> list[str]:
    """The names of the packages of the recipe's ``requirements.txt``."""
    root = source_root() if root is None else root
    lines = [
        line.split("#", 1)[0].strip()
        for line in recipe_path(root, "requirements.txt").read_text().splitlines()
    ]
    return [normalize_name(line) for line in lines if line]


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
