"""Building the sandbox image (what goes into it and its names: :mod:`kernelbridge.image`).

Two builders make the same layout:

- the default needs **no container registry**: ``mmdebstrap`` bootstraps a Debian bookworm
  minbase root with ``python3``; the host's pip downloads manylinux wheels for CPython 3.11 into it
  (the recipe's ``requirements.txt`` and the operator's extras, resolved together); the agent is
  copied to ``/opt/kernelbridge``; ``customize.sh`` trims it and pre-compiles bytecode;
  ``podman import`` turns the tarball into an image with the ENV, WORKDIR and CMD lines of the
  Containerfile and the labels;
- ``containerfile=True`` runs ``podman build`` on the Containerfile for machines that can pull
  ``debian:bookworm-slim``.

As root, mmdebstrap runs in its ``root`` mode. As anyone else it runs in ``unshare`` mode: inside
a user namespace whose root is the first id of the user's ``/etc/subuid`` range, *not* the user,
so everything it reads from our work directory must be readable by "others" (a 0700 temporary
directory made ``customize.sh`` unreadable). What unshare mode needs is checked first
(:func:`unshare_problem`), so a machine that cannot do it gets the real cause in one line.

Run ``python -m kernelbridge.image [--force] [--containerfile] [--with PKG]`` from a shell
(``scripts/setup.sh`` does).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernelbridge import __version__
from kernelbridge.errors import ImageError, KernelBridgeError
from kernelbridge.image import (
    AGENT_HASH_FILE,
    AGENT_PACKAGE,
    HASH_LABEL,
    IMAGE_HASH_LABEL,
    NO_EXTRAS,
    PACKAGES_LABEL,
    RECIPE_DIR,
    RECIPE_FILES,
    REPOSITORY,
    VERSION_LABEL,
    ImageExtras,
    Log,
    agent_hash,
    base_requirements,
    image_files,
    image_hash,
    image_labels,
    image_tag,
    labels_status,
    packages_label,
    recipe_path,
    source_path,
    source_root,
)

PACKAGE_STUB = '"""kernelbridge inside the sandbox: the frame codec and the agent only."""\n'
# Layout inside the image.
AGENT_PREFIX = "opt/kernelbridge"
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
EXTRA_REQUIREMENTS = "extra-requirements.txt"

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
# Images of other hashes kept after a build (newest first): neighbouring versions or checkouts on
# the same machine may still use them; older ones are removed to bound disk use.
KEEP_IMAGES = 4
INSPECT_TIMEOUT = 30.0
# Lines of a failing command's output that go into the ImageError message.
ERROR_TAIL_LINES = 3
# Debian's system users reach uid 65534 (nobody): a user namespace for a whole root file system
# needs that many subordinate ids.
SUBID_RANGE = 65536
UNSHARE_PROBE_TIMEOUT = 10.0


def build_image(
    executable: str = "podman",
    *,
    force: bool = False,
    log: Log = print,
    containerfile: bool = False,
    root: Path | None = None,
    extras: ImageExtras = NO_EXTRAS,
) -> str:
    """Build the sandbox image of this kernelbridge and ``extras`` and return its tag.

    Without ``force``, an image that is already current is kept. After a successful build an image
    without extras is also tagged ``:latest``, and older images of other hashes are pruned.

    Raises ImageError, with a one-line cause and fix, when a tool is missing or a step fails.
    """
    root = source_root() if root is None else root
    with tempfile.TemporaryDirectory(prefix="kernelbridge-image-") as tmp:
        work = Path(tmp)
        # Build from a snapshot: the tree may change during the minute a build takes (an editor
        # saving, a checkout), and the label must describe what the image really holds.
        source = _snapshot(root, work / "source")
        hash_ = image_hash(extras, source)
        tag = image_tag(hash_)
        if not force and labels_status(image_labels(executable, tag), hash_) == "current":
            log(f"sandbox image {tag} is current")
            if not extras:
                _point_latest_at(executable, tag, hash_)
            return tag
        with _build_lock(log):
            # Whoever held the lock may just have built this very image.
            if not force and labels_status(image_labels(executable, tag), hash_) == "current":
                log(f"sandbox image {tag} is current")
                return tag
            started = time.monotonic()
            agent = agent_hash(source)
            labels = {HASH_LABEL: agent, IMAGE_HASH_LABEL: hash_, VERSION_LABEL: __version__}
            if containerfile:
                _build_from_containerfile(executable, source, work / "context", labels, tag, log, extras)
            else:
                _build_without_registry(executable, source, work, labels, tag, log, extras)
            if not extras:
                _point_latest_at(executable, tag, hash_)
            _remove_other_images(executable, tag, log)
            log(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def _point_latest_at(executable: str, tag: str, hash_: str) -> None:
    """Tag ``tag`` as ``:latest`` unless it already is: ``:latest`` names the plain image this
    kernelbridge uses, even when another source tree on the machine built (and tagged) since."""
    if labels_status(image_labels(executable, f"{REPOSITORY}:latest"), hash_) != "current":
        _run([executable, "tag", tag, f"{REPOSITORY}:latest"], "tag the image", "check `podman images`")


def _snapshot(root: Path, dest: Path) -> Path:
    """Copy the image's files from ``root`` to ``dest`` (same layout); returns ``dest``."""
    for name in image_files(root):
        target = source_path(dest, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path(root, name), target)
    return dest


# -- the registry-free builder -------------------------------------------------------------------------
def _build_without_registry(
    executable: str,
    root: Path,
    work: Path,
    labels: dict[str, str],
    tag: str,
    log: Log,
    extras: ImageExtras,
) -> None:
    """mmdebstrap + host pip + podman import: no registry, only Debian and PyPI mirrors."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError(
            "mmdebstrap is not installed and the registry-free image build needs it;"
            " install it (`sudo apt-get install mmdebstrap`)"
            " or use `kernelbridge image build --containerfile`"
        )
    if os.geteuid() != 0 and (problem := unshare_problem()) is not None:
        raise ImageError(f"cannot build the image as a normal user here: {problem}")
    overlay = work / "overlay"
    with _step(log, "stage the agent"):
        _stage_agent(root, overlay / AGENT_PREFIX, labels[HASH_LABEL])
    site = overlay / SITE_PACKAGES
    with _step(log, "download Python packages" + (f" (with {' '.join(extras.names())})" if extras else "")):
        extra_file = work / EXTRA_REQUIREMENTS
        extra_file.write_text(extras.text())
        _install_packages(recipe_path(root, "requirements.txt"), extra_file, site)
    labels[PACKAGES_LABEL] = packages_label(
        installed_packages(site), base_requirements(root) + extras.names()
    )
    tarball = work / "rootfs.tar"
    with _step(log, "bootstrap Debian and customize"):
        _readable_by_others(work)
        _bootstrap(recipe_path(root, "customize.sh"), overlay, tarball)
    with _step(log, f"import into {executable}"):
        changes = _import_changes(recipe_path(root, "Containerfile"), labels)
        argv = [executable, "import", *(f"--change={change}" for change in changes), str(tarball), tag]
        _run(argv, f"{executable} import", "check free disk space and `podman info`")


def _stage_agent(root: Path, prefix: Path, agent: str) -> None:
    """Copy the agent's files under ``prefix`` (becomes /opt/kernelbridge) with its AGENT_HASH."""
    for name in image_files(root):
        if name.startswith(f"{RECIPE_DIR}/"):
            continue
        target = prefix / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path(root, name), target)
    (prefix / "kernelbridge" / "__init__.py").write_text(PACKAGE_STUB)
    (prefix / AGENT_PACKAGE / AGENT_HASH_FILE).write_text(agent + "\n")


def _install_packages(requirements: Path, extras: Path, target: Path) -> None:
    """Install the image's wheels with the host's pip into ``target`` (the image's dist-packages):
    the recipe's and the extras in one resolution, so their versions fit together."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    argv += ["--no-compile", "--no-warn-script-location", *PIP_TARGET_FLAGS]
    argv += ["--target", str(target), "--requirement", str(requirements), "--requirement", str(extras)]
    # A pip constraints file of the host (e.g. /etc/xdg/pip) constrains the host's environment, not
    # the image's; pip reads PIP_CONSTRAINT before its config files, so an empty one disables it.
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    _run(
        argv,
        "pip install of the image's packages",
        "check PyPI access and that every package has a wheel for CPython 3.11 on manylinux x86_64",
        env=env,
    )


def installed_packages(site: Path) -> dict[str, str]:
    """{normalized name: version} of the distributions installed in ``site``."""
    from kernelbridge.image import normalize_name

    found = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        if name:
            found[normalize_name(name)] = dist.version
    return found


def _readable_by_others(work: Path) -> None:
    """Let unshare mode's root (a subordinate id, not us) read what it copies and runs: the work
    directory is 0700 (tempfile's default), and some wheels ship files without "other" bits. The
    contents are public anyway (the agent's code and wheels from PyPI)."""
    if os.geteuid() == 0:
        return
    for path in [work, *work.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        extra = 0o055 if path.is_dir() else 0o044 | (0o011 if mode & 0o100 else 0)
        if mode & extra != extra:
            path.chmod(mode | extra)


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
    _run(argv, "mmdebstrap", "check access to deb.debian.org (or set a Debian mirror you can reach)")


def _import_changes(containerfile: Path, labels: dict[str, str]) -> list[str]:
    """The ``--change`` instructions for ``podman import``: the Containerfile's ENV, WORKDIR and CMD
    lines (one source of truth for both builders) and the labels."""
    changes = [
        line.strip()
        for line in containerfile.read_text().splitlines()
        if line.split(" ", 1)[0] in ("ENV", "WORKDIR", "CMD")
    ]
    # podman import splits a change on its first space and takes the rest as `key=value`: values
    # with spaces (the packages label) must be quoted as in a Containerfile.
    return [*changes, *(f"LABEL {key}={json_quote(value)}" for key, value in labels.items())]


def json_quote(value: str) -> str:
    """A label value as a Containerfile accepts it: bare when it has no space or quote."""
    if value and not any(ch in value for ch in ' "\\\t'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- unshare mode --------------------------------------------------------------------------------------
def unshare_problem() -> str | None:
    """Why mmdebstrap's unshare mode cannot work for this user, with the fix; None if it can."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    fix = f"sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}"
    for path in ("/etc/subuid", "/etc/subgid"):
        size = _subid_range(Path(path), user, uid)
        if size is None:
            return (
                f"{path} gives {user} no subordinate ids (mmdebstrap's unshare mode needs them); run `{fix}`"
            )
        if size < SUBID_RANGE:
            return f"{path} gives {user} only {size} subordinate ids, {SUBID_RANGE} are needed; run `{fix}`"
    if shutil.which("newuidmap") is None or shutil.which("newgidmap") is None:
        return "newuidmap/newgidmap are missing (they map the subordinate ids); `sudo apt-get install uidmap`"
    if shutil.which("unshare") is not None:
        try:
            probe = subprocess.run(
                ["unshare", "--user", "--map-root-user", "true"],
                capture_output=True,
                text=True,
                timeout=UNSHARE_PROBE_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot probe user namespaces ({exc})"
        if probe.returncode != 0:
            why = (probe.stderr.strip().splitlines() or ["refused"])[-1]
            return (
                f"user namespaces are disabled for normal users ({why}); enable them"
                " (`sudo sysctl kernel.unprivileged_userns_clone=1`, or on Ubuntu 24.04"
                " `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`) or build as root"
            )
    return None


def _subid_range(path: Path, user: str, uid: int) -> int | None:
    """The total size of ``user``'s (or ``uid``'s) ranges in a subuid/subgid file; None if none."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user, str(uid)) and parts[2].isdigit():
            total += int(parts[2])
    return total or None


# -- the Containerfile builder -------------------------------------------------------------------------
def _build_from_containerfile(
    executable: str,
    root: Path,
    work: Path,
    labels: dict[str, str],
    tag: str,
    log: Log,
    extras: ImageExtras,
) -> None:
    """``podman build`` on the Containerfile, with a build context holding only what it copies."""
    with _step(log, "stage the build context"):
        work.mkdir(parents=True, exist_ok=True)
        for name in RECIPE_FILES:
            shutil.copyfile(recipe_path(root, name), work / name)
        (work / EXTRA_REQUIREMENTS).write_text(extras.text())
        _stage_agent(root, work / AGENT_PREFIX, labels[HASH_LABEL])
    with _step(log, f"{executable} build"):
        argv = [executable, "build", "--file", str(work / "Containerfile"), "--tag", tag]
        args = {
            "AGENT_HASH": labels[HASH_LABEL],
            "IMAGE_HASH": labels[IMAGE_HASH_LABEL],
            "KERNELBRIDGE_VERSION": __version__,
            # Names only: the versions pip picks are not known before the build.
            "PACKAGES": " ".join(base_requirements(root) + extras.names()),
        }
        for key, value in args.items():
            argv += ["--build-arg", f"{key}={value}"]
        _run([*argv, str(work)], f"{executable} build", "check that the registry is reachable")


# -- after a build ---------------------------------------------------------------------------------------
def _remove_other_images(executable: str, keep: str, log: Log) -> None:
    """Remove older images of other hashes, keeping the newest :data:`KEEP_IMAGES` (a bridge or
    checkout of a neighbouring version may still start sandboxes from them) and any image still
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
    from kernelbridge.config import load_settings
    from kernelbridge.image import extras_from_settings

    parser = argparse.ArgumentParser(prog="python -m kernelbridge.image", description=main.__doc__)
    parser.add_argument("--executable", default="podman", help="container runtime CLI (default: podman)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    parser.add_argument("--containerfile", action="store_true", help="podman build (needs a registry)")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="PACKAGE",
                        help="add a Python package to the image (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        extras = extras_from_settings(load_settings()).plus(args.extra)
        build_image(args.executable, force=args.force, containerfile=args.containerfile, extras=extras)
    except KernelBridgeError as exc:
        print(f"kernelbridge: {exc}", file=sys.stderr)
        return 1
    return 0
