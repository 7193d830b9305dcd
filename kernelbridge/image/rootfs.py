"""The registry-free root file system: Debian from its mirror, Python packages from PyPI, no
container registry and no container runtime.

``mmdebstrap`` bootstraps a Debian bookworm minbase root with ``python3``; the host's pip downloads
manylinux wheels for CPython 3.11 into it (the requirement files of the image's profile and the
operator's extras, resolved together); the code that runs inside is copied to ``/opt/kernelbridge``;
``customize.sh`` trims it and pre-compiles bytecode. The result is a tarball, which the builder
imports through the runtime's ImageStore (:mod:`kernelbridge.image.build`). As root, mmdebstrap runs
in its ``root`` mode, as anyone else in ``unshare`` mode, whose needs :func:`unshare_problem` checks
first (the real cause in one line). Design: docs/design/packages-and-images.md.
"""

from __future__ import annotations

import importlib.metadata
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from kernelbridge.errors import ImageError
from kernelbridge.image.containerfile import AGENT_PREFIX
from kernelbridge.image.labels import HASH_LABEL, PACKAGES_LABEL, packages_label
from kernelbridge.image.recipe import (
    EXTRA_REQUIREMENTS,
    ImageContents,
    normalize_name,
    recipe_path,
    requested_packages,
    stage_agent,
)
from kernelbridge.image.target import PIP_TARGET_FLAGS

Log = Callable[[str], None]

SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# dpkg skips these paths while installing (faster than deleting them afterwards); copyrights stay.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
# Debian's system users reach uid 65534 (nobody): a user namespace for a whole root file system
# needs that many subordinate ids.
SUBID_RANGE = 65536
UNSHARE_PROBE_TIMEOUT = 10.0
ERROR_TAIL_LINES = 3
"""Lines of a failing command's output that go into the ImageError message."""


async def make_rootfs(
    root: Path, work: Path, labels: dict[str, str], contents: ImageContents, log: Log
) -> Path:
    """The image's root file system as a tarball under ``work``, from the image files under
    ``root``, with the packages of ``contents``; sets ``labels``' packages label. Raises
    ImageError (one line, with the fix) when a tool is missing, unshare mode cannot work here,
    or a step fails."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError(
            "mmdebstrap is not installed and the registry-free image build needs it;"
            " install it (`sudo apt-get install mmdebstrap`)"
            " or use `kernelbridge image build --containerfile`"
        )
    if os.geteuid() != 0 and (problem := unshare_problem()) is not None:
        raise ImageError(f"cannot build the image as a normal user here: {problem}")
    overlay = work / "overlay"
    with step(log, "stage the agent"):
        stage_agent(root, overlay / AGENT_PREFIX, labels[HASH_LABEL])
    site = overlay / SITE_PACKAGES
    with step(log, f"download Python packages ({contents.describe()})"):
        extra_file = work / EXTRA_REQUIREMENTS
        extra_file.write_text(contents.extras_text())
        files = [recipe_path(root, name) for name in contents.requirement_files]
        await _install_packages([*files, extra_file], site)
    installed = await anyio.to_thread.run_sync(installed_packages, site)
    labels[PACKAGES_LABEL] = packages_label(installed, requested_packages(contents, root))
    tarball = work / "rootfs.tar"
    with step(log, "bootstrap Debian and customize"):
        await anyio.to_thread.run_sync(_readable_by_others, work)
        await _bootstrap(recipe_path(root, "customize.sh"), overlay, tarball)
    return tarball


async def _install_packages(requirements: list[Path], target: Path) -> None:
    """Install the image's wheels with the host's pip into ``target`` (the image's dist-packages):
    every requirements file (the profile's, the extras) in one resolution, so their versions fit
    together."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    argv += ["--no-compile", "--no-warn-script-location", *PIP_TARGET_FLAGS, "--target", str(target)]
    argv += [arg for path in requirements for arg in ("--requirement", str(path))]
    # A pip constraints file of the host (e.g. /etc/xdg/pip) constrains the host's environment, not
    # the image's; pip reads PIP_CONSTRAINT before its config files, so an empty one disables it.
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    await _run(
        argv,
        "pip install of the image's packages",
        "check PyPI access and that every package has a wheel for CPython 3.11 on manylinux x86_64",
        env=env,
    )


def installed_packages(site: Path) -> dict[str, str]:
    """{normalized name: version} of the distributions installed in ``site``."""
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


async def _bootstrap(customize: Path, overlay: Path, tarball: Path) -> None:
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
    await _run(argv, "mmdebstrap", "check access to deb.debian.org (or set a Debian mirror you can reach)")


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


@contextmanager
def step(log: Log, what: str) -> Iterator[None]:
    """Log how long one build step took."""
    started = time.monotonic()
    log(f"{what} ...")
    yield
    log(f"{what}: {time.monotonic() - started:.1f} s")


async def _run(argv: list[str], what: str, hint: str, env: dict[str, str] | None = None) -> None:
    """Run one build command; on failure raise ImageError with the end of its output and ``hint``."""
    try:
        proc = await anyio.run_process(argv, env=env, check=False)
    except OSError as exc:
        raise ImageError(f"{what} could not start ({exc}); {hint}") from exc
    if proc.returncode != 0:
        stderr, stdout = proc.stderr.decode(errors="replace"), proc.stdout.decode(errors="replace")
        output = (stderr.strip() or stdout.strip()).splitlines()[-ERROR_TAIL_LINES:]
        detail = " | ".join(line.strip() for line in output) or f"exit status {proc.returncode}"
        raise ImageError(f"{what} failed: {detail}; {hint}")
