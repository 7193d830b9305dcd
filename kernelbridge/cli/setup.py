"""``kernelbridge setup``: make this machine ready for an installed kernelbridge, in one command.

What it does, in order, saying each step:

1. the Debian packages kernelbridge needs (podman, runc, mmdebstrap, uidmap): as root it installs
   the missing ones with apt-get; as anyone else it installs nothing and prints the ``sudo`` line;
2. as a normal user, what mmdebstrap's unshare mode and rootless podman need (subordinate ids,
   user namespaces), each missing piece with its fix;
3. the state directory;
4. rootless podman's storage driver, as the selected runtime reports it: podman 4.3 starts new
   users on ``vfs``, which copies the whole image (~470 MB) for every sandbox; on a storage that
   is still empty setup switches to ``overlay`` (native, else fuse-overlayfs) and says so,
   otherwise it prints how to;
5. the sandbox image (``--with`` adds packages), built into the selected runtime's image store;
6. ``doctor``; 7. the ``mcpServers`` entry for an MCP client, with this installation's absolute path.

Every container chore goes through :mod:`kernelbridge.runtime` (the selected runtime, and for the
storage switch the local podman's own module there); setup itself runs only apt-get. The
checkout's ``scripts/setup.sh`` does the same for a development tree (plus the venv and the test
peers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from kernelbridge import __version__
from kernelbridge.cli.doctor import run_doctor
from kernelbridge.config import Settings, check_state_dir
from kernelbridge.errors import KernelBridgeError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands
    from kernelbridge.image import ImageExtras

# command -> the Debian package that provides it
NEEDED = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
ROOTLESS_NEEDED = {"newuidmap": "uidmap"}


def add_parsers(sub: Subcommands) -> None:
    setup = sub.add_parser("setup", help="check this machine, build the sandbox image, run doctor")
    setup.add_argument("--with", dest="packages", action="append", default=[], metavar="PACKAGE",
                       help="add a Python package to the image (repeatable)")  # fmt: skip
    setup.set_defaults(run=cmd_setup)


def cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    return run_setup(settings, packages=args.packages)


def say(message: str) -> None:
    print(f"setup: {message}", flush=True)


def missing_packages(root: bool) -> list[str]:
    """Debian packages whose commands are missing here."""
    needed = dict(NEEDED)
    if not root:
        needed.update(ROOTLESS_NEEDED)
    return sorted({package for command, package in needed.items() if shutil.which(command) is None})


def kernelbridge_command() -> str:
    """The absolute path of this installation's ``kernelbridge`` script (for MCP client configs)."""
    beside = Path(sys.executable).with_name("kernelbridge")
    if beside.exists():
        return str(beside)
    return shutil.which("kernelbridge") or f"{sys.executable} -m kernelbridge.cli"


async def storage_and_image(settings: Settings, extras: ImageExtras, *, rootless: bool) -> str:
    """Steps 4 and 5: the storage driver (rootless only), then the image; its tag.
    Raises KernelBridgeError (one line) when the runtime cannot be used or the build fails."""
    from kernelbridge.image import build_image
    from kernelbridge.runtime import VFS_WARNING, open_runtime, rootless_storage_conf, use_overlay_storage

    if rootless:
        async with open_runtime(settings) as runtime:
            info = await runtime.info()
        # The runtime is closed again first: a podman service of ours would keep the old storage open.
        if info.engine == "podman" and info.rootless and info.storage_driver == "vfs":
            switched = await use_overlay_storage()
            say(
                f"rootless podman's storage was empty and on vfs: switched it to {switched}"
                f" ({rootless_storage_conf()})"
                if switched
                else VFS_WARNING
            )
    async with open_runtime(settings) as runtime:
        return await build_image(runtime.images, extras=extras, log=say)


def run_setup(settings: Settings, packages: list[str]) -> int:
    """Run every step (module docstring); returns the exit status."""
    from kernelbridge.image import extras_from_settings
    from kernelbridge.image.rootfs import unshare_problem

    root = os.geteuid() == 0
    who = "root" if root else "a normal user"
    say(f"kernelbridge {__version__} ({kernelbridge_command()}), running as {who}")
    missing = missing_packages(root)
    if missing and not root:
        say(f"missing system packages: {' '.join(missing)}")
        say(f"install them with: sudo apt-get update && sudo apt-get install -y {' '.join(missing)}")
        return 1
    if missing:
        say(f"installing {' '.join(missing)} with apt-get ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            if subprocess.run(argv, env=env, check=False).returncode != 0:
                say(f"`{' '.join(argv)}` failed; install {' '.join(missing)} yourself and run setup again")
                return 1
    if not root and (problem := unshare_problem()) is not None:
        say(problem)
        return 1
    check_state_dir(settings)
    say(f"state directory: {settings.state_dir}")
    extras = extras_from_settings(settings).plus(packages)
    try:
        tag = anyio.run(partial(storage_and_image, rootless=not root), settings, extras)
    except KernelBridgeError as exc:
        say(str(exc))
        return 1
    say(f"sandbox image: {tag}")
    # Doctor (and the bridge) must look for the image of these packages, not the plain one.
    settings = dataclasses.replace(settings, image_packages=extras.requirements, image_requirements=None)
    say("doctor:")
    status = anyio.run(run_doctor, settings)
    env = {}
    if extras:
        env["KERNELBRIDGE_IMAGE_PACKAGES"] = " ".join(extras.requirements)
    if settings.allow_unlimited:
        env["KERNELBRIDGE_ALLOW_UNLIMITED"] = "1"
    entry = {"command": kernelbridge_command(), "args": ["serve"], **({"env": env} if env else {})}
    say("an MCP client runs it with this entry in its mcpServers:")
    print(json.dumps({"mcpServers": {"python": entry}}, indent=2))
    if status != 0:
        say("doctor found a problem (the FAIL lines above say what to do)")
    return status
