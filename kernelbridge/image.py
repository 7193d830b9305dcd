"""The sandbox image: what goes into it, its name, whether the local copy is current, and its build.

The image is named after the **agent hash**, a sha256 over every file that goes into the image from
the source tree (the agent, the modules it imports, and the recipe in ``sandbox_kernel_image/``).
The same hash is baked into the image twice: as the label ``kernelbridge.agent-hash`` (read by
:func:`image_status` without starting a container) and as ``kernelbridge/sandbox/AGENT_HASH`` (read
by the agent, which refuses a host expecting another agent). Editing any of those files therefore
makes the image stale, and ``kernelbridge image build`` (or :func:`ensure_image`) rebuilds it.

Two builders make the same layout:

- the default needs **no container registry**: ``mmdebstrap`` bootstraps a Debian bookworm minbase
  root with ``python3``; the host's pip downloads manylinux wheels for CPython 3.11 into it; the
  agent is copied to ``/opt/kernelbridge``; ``sandbox_kernel_image/customize.sh`` trims it and
  pre-compiles bytecode; ``podman import`` turns the tarball into an image with the ENV, WORKDIR and
  CMD lines of the Containerfile;
- ``containerfile=True`` runs ``podman build`` on ``sandbox_kernel_image/Containerfile`` for machines
  that can pull ``debian:bookworm-slim``.

This module does not know how sandboxes are run (``kernelbridge.runtime``); it only needs the runtime's
executable for ``image inspect``, ``import``, ``build``, ``tag`` and ``rmi``.

Run ``python -m kernelbridge.image [--force] [--containerfile] [--executable podman]`` to ensure the
image from a shell (``scripts/setup.sh`` does).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from kernelbridge import __version__
from kernelbridge.errors import ImageError

__all__ = [
    "HASH_LABEL",
    "REPOSITORY",
    "ImageStatus",
    "agent_hash",
    "build_image",
    "default_image",
    "ensure_image",
    "image_files",
    "image_status",
    "image_tag",
]

ImageStatus = Literal["current", "stale", "missing"]
Log = Callable[[str], None]

REPOSITORY = "localhost/kernelbridge-sandbox"
HASH_LABEL = "kernelbridge.agent-hash"
VERSION_LABEL = "kernelbridge.version"

# What goes into the image from the source tree, relative to the repository root: only code that
# runs in the sandbox, so that changing a host setting or the bridge never makes an image stale.
# The agent imports ``kernelbridge.frames`` (stdlib only); the package ``__init__`` it needs for
# that is a fixed stub written by the builder (the host's ``__init__`` imports host settings).
AGENT_MODULES = ("kernelbridge/frames.py",)
PACKAGE_STUB = '"""kernelbridge inside the sandbox: the frame codec and the agent only."""\n'
AGENT_PACKAGE = "kernelbridge/sandbox"
AGENT_HASH_FILE = "AGENT_HASH"
RECIPE_DIR = "sandbox_kernel_image"
RECIPE_FILES = ("requirements.txt", "customize.sh", "Containerfile")

# Layout inside the image.
AGENT_PREFIX = "opt/kernelbridge"
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The image's interpreter is Debian bookworm's python3 (3.11); pip picks wheels for it, not for
# whatever Python runs this module. Several manylinux tags because projects publish under any of them.
PIP_TARGET_FLAGS = (
    "--only-binary=:all:",
    "--platform=manylinux2014_x86_64",
    "--platform=manylinux_2_17_x86_64",
    "--platform=manylinux_2_28_x86_64",
    "--implementation=cp",
    "--python-version=3.11",
    "--abi=cp311",
)
# dpkg skips these paths while installing (faster than deleting them afterwards); copyrights stay.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
# Images of other agent hashes kept after a build (newest first): neighbouring versions or
# checkouts on the same machine may still use them; older ones are removed to bound disk use.
KEEP_IMAGES = 4
# Bounds on the runtime CLI calls that are not builds: they answer in well under a second.
INSPECT_TIMEOUT = 30.0
# Lines of a failing command's output that go into the ImageError message.
ERROR_TAIL_LINES = 3


# -- what goes into the image ------------------------------------------------------------------------
def source_root() -> Path:
    """The directory above the ``kernelbridge`` package: the repository of an editable install."""
    return Path(__file__).resolve().parent.parent


def image_files(root: Path | None = None) -> list[str]:
    """Sorted repository-relative paths (POSIX) of every source file that goes into the image.

    Raises ImageError when a file is missing, e.g. kernelbridge is not installed from a checkout.
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
    missing = [name for name in files if not (root / name).is_file()]
    if missing or not package.is_dir():
        raise ImageError(
            f"the sandbox image's sources are not under {root}"
            f" (missing {', '.join(missing) or AGENT_PACKAGE});"
            " build the image from a kernelbridge checkout (`pip install -e .`)"
        )
    return sorted(set(files))


def agent_hash(root: Path | None = None) -> str:
    """The sha256 (hex) of the image's source files: their relative paths and contents, sorted.

    Each file contributes its path, a NUL, its length and its bytes, so no two trees collide by
    moving bytes across a file boundary.
    """
    root = source_root() if root is None else root
    digest = hashlib.sha256()
    for name in image_files(root):
        data = (root / name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def image_tag(hash_: str) -> str:
    """The local image reference for an agent hash: ``localhost/kernelbridge-sandbox:<hash[:16]>``."""
    return f"{REPOSITORY}:{hash_[:16]}"


def default_image() -> str:
    """The image this kernelbridge expects: the tag of its own agent hash."""
    return image_tag(agent_hash())


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
        return None
    try:
        (info,) = json.loads(proc.stdout)
    except ValueError:
        return None
    # podman puts the labels at top level and under Config; docker only under Config.
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    return {str(key): str(value) for key, value in labels.items()}


def image_status(executable: str, image: str) -> ImageStatus:
    """``current`` if ``image`` exists and carries this tree's agent hash, ``stale`` if it carries
    another, ``missing`` if there is no such image."""
    return _status(executable, image, agent_hash())


def _status(executable: str, image: str, hash_: str) -> ImageStatus:
    labels = image_labels(executable, image)
    if labels is None:
        return "missing"
    return "current" if labels.get(HASH_LABEL) == hash_ else "stale"


def ensure_image(executable: str = "podman", *, log: Log = print) -> str:
    """Return the tag of the current image, building it first only when it is missing or stale."""
    return build_image(executable, force=False, log=log)


# -- the build -----------------------------------------------------------------------------------------
def build_image(
    executable: str = "podman",
    *,
    force: bool = False,
    log: Log = print,
    containerfile: bool = False,
    root: Path | None = None,
) -> str:
    """Build the sandbox image of this source tree and return its tag.

    Without ``force``, an image that is already current is kept. After a successful build the image
    is also tagged ``:latest``, and images of other agent hashes are removed (keeps disk bounded;
    an image still used by a container stays).

    Raises ImageError, with a one-line fix, when a tool is missing or a step fails.
    """
    root = source_root() if root is None else root
    with tempfile.TemporaryDirectory(prefix="kernelbridge-image-") as tmp:
        work = Path(tmp)
        # Build from a snapshot: the tree may change during the minute a build takes (an editor
        # saving, a checkout), and the label must describe what the image really holds.
        source = _snapshot(root, work / "source")
        hash_ = agent_hash(source)
        tag = image_tag(hash_)
        if not force and _status(executable, tag, hash_) == "current":
            log(f"sandbox image {tag} is current")
            return tag
        with _build_lock(log):
            # Whoever held the lock may just have built this very image.
            if not force and _status(executable, tag, hash_) == "current":
                log(f"sandbox image {tag} is current")
                return tag
            _build(executable, source, work, hash_, tag, log, containerfile)
    return tag


def _snapshot(root: Path, dest: Path) -> Path:
    """Copy the image's source files from ``root`` to ``dest``; returns ``dest``."""
    for name in image_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)
    return dest


def _build(
    executable: str, source: Path, work: Path, hash_: str, tag: str, log: Log, containerfile: bool
) -> None:
    """Build from the snapshot ``source``, tag ``:latest`` and prune; the caller holds the build lock."""
    started = time.monotonic()
    if containerfile:
        _build_from_containerfile(executable, source, work / "context", hash_, tag, log)
    else:
        _build_without_registry(executable, source, work, hash_, tag, log)
    _run([executable, "tag", tag, f"{REPOSITORY}:latest"], "tag the image", "check `podman images`")
    _remove_other_images(executable, tag, log)
    log(f"built {tag} in {time.monotonic() - started:.1f} s")


def _build_without_registry(executable: str, root: Path, work: Path, hash_: str, tag: str, log: Log) -> None:
    """mmdebstrap + host pip + podman import: no registry, only Debian and PyPI mirrors."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError(
            "mmdebstrap is not installed and the registry-free image build needs it;"
            " install it (`apt-get install mmdebstrap`) or use `kernelbridge image build --containerfile`"
        )
    overlay = work / "overlay"
    with _step(log, "stage the agent"):
        _stage_agent(root, overlay / AGENT_PREFIX, hash_)
    with _step(log, "download Python packages"):
        _install_packages(root / RECIPE_DIR / "requirements.txt", overlay / SITE_PACKAGES)
    tarball = work / "rootfs.tar"
    with _step(log, "bootstrap Debian and customize"):
        _bootstrap(root / RECIPE_DIR / "customize.sh", overlay, tarball)
    with _step(log, f"import into {executable}"):
        changes = _import_changes(root / RECIPE_DIR / "Containerfile", hash_)
        argv = [executable, "import", *(f"--change={change}" for change in changes), str(tarball), tag]
        _run(argv, f"{executable} import", "check free disk space and `podman info`")


def _stage_agent(root: Path, prefix: Path, hash_: str) -> None:
    """Copy the agent's files under ``prefix`` (becomes /opt/kernelbridge) with its AGENT_HASH."""
    for name in image_files(root):
        if name.startswith(f"{RECIPE_DIR}/"):
            continue
        target = prefix / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)
    (prefix / "kernelbridge" / "__init__.py").write_text(PACKAGE_STUB)
    (prefix / AGENT_PACKAGE / AGENT_HASH_FILE).write_text(hash_ + "\n")


def _install_packages(requirements: Path, target: Path) -> None:
    """Install the image's wheels with the host's pip into ``target`` (the image's dist-packages)."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    argv += ["--no-compile", "--no-warn-script-location", *PIP_TARGET_FLAGS]
    argv += ["--target", str(target), "--requirement", str(requirements)]
    # A pip constraints file of the host (e.g. /etc/xdg/pip) constrains the host's environment, not
    # the image's; pip reads PIP_CONSTRAINT before its config files, so an empty one disables it.
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    _run(argv, "pip install of the image's packages", "check PyPI access and the requirements", env=env)


def _bootstrap(customize: Path, overlay: Path, tarball: Path) -> None:
    """Make the root file system tarball: Debian minbase + python3, the overlay, customize.sh."""
    mode = "root" if os.geteuid() == 0 else "unshare"
    argv = ["mmdebstrap", "--quiet", f"--mode={mode}", "--variant=minbase"]
    argv += ["--include=python3,ca-certificates", *(f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES)]
    # Hooks run in a shell with the root file system as "$1". The overlay is copied in before
    # customize.sh runs, so that it pre-compiles the packages with the image's own python3.
    argv += [f"--customize-hook=sync-in {shlex.quote(str(overlay))} /"]
    argv += [f'--customize-hook=sh {shlex.quote(str(customize))} "$1"']
    # The tarball keeps /dev's device nodes; they are harmless (every runtime mounts its own /dev)
    # and rootless import skips them.
    argv += [DEBIAN_SUITE, str(tarball), DEBIAN_MIRROR]
    hint = "check access to deb.debian.org" + ("" if mode == "root" else " and /etc/subuid for unshare mode")
    _run(argv, "mmdebstrap", hint)


def _import_changes(containerfile: Path, hash_: str) -> list[str]:
    """The ``--change`` instructions for ``podman import``: the Containerfile's ENV, WORKDIR and CMD
    lines (one source of truth for both builders) and the labels."""
    changes = [
        line.strip()
        for line in containerfile.read_text().splitlines()
        if line.split(" ", 1)[0] in ("ENV", "WORKDIR", "CMD")
    ]
    return [*changes, f"LABEL {HASH_LABEL}={hash_}", f"LABEL {VERSION_LABEL}={__version__}"]


def _build_from_containerfile(
    executable: str, root: Path, work: Path, hash_: str, tag: str, log: Log
) -> None:
    """``podman build`` on the Containerfile, with a build context holding only what it copies."""
    with _step(log, "stage the build context"):
        work.mkdir(parents=True, exist_ok=True)
        for name in RECIPE_FILES:
            shutil.copyfile(root / RECIPE_DIR / name, work / name)
        _stage_agent(root, work / AGENT_PREFIX, hash_)
    with _step(log, f"{executable} build"):
        argv = [executable, "build", "--file", str(work / "Containerfile"), "--tag", tag]
        argv += ["--build-arg", f"AGENT_HASH={hash_}", "--build-arg", f"KERNELBRIDGE_VERSION={__version__}"]
        _run([*argv, str(work)], f"{executable} build", "check that the registry is reachable")


def _remove_other_images(executable: str, keep: str, log: Log) -> None:
    """Remove older images of other agent hashes, keeping the newest :data:`KEEP_IMAGES` (a bridge
    or checkout of a neighbouring version may still start sandboxes from them) and any image still
    used by a container; untagged leftovers of ``--force`` rebuilds go too."""
    proc = subprocess.run(
        [executable, "images", "--format", "{{.CreatedAt}}\t{{.Repository}}:{{.Tag}}", REPOSITORY],
        capture_output=True,
        text=True,
        timeout=INSPECT_TIMEOUT,
        check=False,
    )
    rows = sorted((line.split("\t") for line in proc.stdout.splitlines() if "\t" in line), reverse=True)
    others = [ref for _, ref in rows if ref not in (keep, f"{REPOSITORY}:latest")]
    stale = others[KEEP_IMAGES:]
    # A rebuild under the same tag (--force) leaves the previous image untagged.
    untagged = subprocess.run(
        [executable, "images", "--quiet", "--filter", "dangling=true", "--filter", f"label={HASH_LABEL}"],
        capture_output=True,
        text=True,
        timeout=INSPECT_TIMEOUT,
        check=False,
    )
    for ref in stale + untagged.stdout.split():
        removed = subprocess.run(
            [executable, "rmi", ref], capture_output=True, timeout=INSPECT_TIMEOUT, check=False
        )
        log(f"removed old image {ref}" if removed.returncode == 0 else f"kept old image {ref} (in use)")


# -- helpers ---------------------------------------------------------------------------------------------
@contextmanager
def _build_lock(log: Log) -> Iterator[None]:
    """One build at a time per user: parallel test runs or a `make setup` beside a test session would
    otherwise each spend a minute building the same image and race on its tags."""
    path = Path(tempfile.gettempdir()) / f"kernelbridge-image-build-{os.getuid()}.lock"
    with path.open("a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("waiting for another build of the sandbox image ...")
            fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@contextmanager
def _step(log: Log, what: str) -> Iterator[None]:
    """Log how long one build step took."""
    started = time.monotonic()
    log(f"{what} ...")
    yield
    log(f"{what}: {time.monotonic() - started:.1f} s")


def _run(argv: list[str], what: str, hint: str, env: dict[str, str] | None = None) -> None:
    """Run one build command; on failure raise ImageError with the end of its output and ``hint``."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    except OSError as exc:
        raise ImageError(f"{what} could not start ({exc}); {hint}") from exc
    if proc.returncode != 0:
        output = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-ERROR_TAIL_LINES:]
        detail = " | ".join(line.strip() for line in output) or f"exit status {proc.returncode}"
        raise ImageError(f"{what} failed: {detail}; {hint}")


def main(argv: list[str] | None = None) -> int:
    """``python -m kernelbridge.image``: ensure the image (``--force`` rebuilds it)."""
    parser = argparse.ArgumentParser(prog="python -m kernelbridge.image", description=main.__doc__)
    parser.add_argument("--executable", default="podman", help="container runtime CLI (default: podman)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    parser.add_argument("--containerfile", action="store_true", help="podman build (needs a registry)")
    args = parser.parse_args(argv)
    try:
        build_image(args.executable, force=args.force, containerfile=args.containerfile)
    except ImageError as exc:
        print(f"kernelbridge: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
