"""``kernelbridge setup``: make this machine ready for an installed kernelbridge, in one command.

What it does, in order, saying each step:

1. the Debian packages kernelbridge needs (podman, runc, mmdebstrap, uidmap): as root it installs
   the missing ones with apt-get; as anyone else it installs nothing and prints the ``sudo`` line;
2. as a normal user, what mmdebstrap's unshare mode and rootless podman need (subordinate ids,
   user namespaces), each missing piece with its fix;
3. rootless podman's storage driver: podman 4.3 starts new users on ``vfs``, which copies the
   whole image (~470 MB) for every sandbox; on a storage that is still empty setup switches to
   ``overlay`` (native, else fuse-overlayfs) and says so, otherwise it prints how to;
4. the state directory; 5. the sandbox image (``--with`` adds packages); 6. ``doctor``;
7. the ``mcpServers`` entry for an MCP client, with this installation's absolute path.

The checkout's ``scripts/setup.sh`` does the same for a development tree (plus the venv and the
test peers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio

from kernelbridge import __version__
from kernelbridge.config import Settings, check_state_dir
from kernelbridge.errors import KernelBridgeError

# command -> the Debian package that provides it
NEEDED = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
ROOTLESS_NEEDED = {"newuidmap": "uidmap"}
PODMAN_TIMEOUT = 60.0
VFS_WARNING = (
    "rootless podman uses the vfs storage driver, which copies the whole image for every sandbox"
    " (seconds per start); switch to overlay: `podman system reset` (removes your podman images and"
    ' containers), then put `[storage]` / `driver = "overlay"` in ~/.config/containers/storage.conf'
)


def say(message: str) -> None:
    print(f"setup: {message}", flush=True)


def missing_packages(root: bool) -> list[str]:
    """Debian packages whose commands are missing here."""
    needed = dict(NEEDED)
    if not root:
        needed.update(ROOTLESS_NEEDED)
    return sorted({package for command, package in needed.items() if shutil.which(command) is None})


def _podman(*args: str) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("podman") is None:
        return None
    try:
        return subprocess.run(
            ["podman", *args], capture_output=True, text=True, timeout=PODMAN_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def rootless_storage_driver() -> str | None:
    """The graph driver of this user's rootless podman, or None (root, no podman, podman broken)."""
    if os.geteuid() == 0:
        return None
    proc = _podman("info", "--format", "{{.Store.GraphDriverName}}")
    return proc.stdout.strip() if proc is not None and proc.returncode == 0 else None


def _storage_conf() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "containers" / "storage.conf"


def _storage_is_empty() -> bool:
    proc = _podman("info", "--format", "json")
    if proc is None or proc.returncode != 0:
        return False
    store = json.loads(proc.stdout).get("store", {})
    return not store.get("imageStore", {}).get("number") and not store.get("containerStore", {}).get("number")


def use_overlay_storage() -> str | None:
    """Switch an empty vfs storage to overlay (native, else fuse-overlayfs); returns the driver
    that now works, or None (nothing was left changed)."""
    conf = _storage_conf()
    if conf.exists() or not _storage_is_empty():
        return None
    attempts = ['[storage]\ndriver = "overlay"\n']
    if (fuse := shutil.which("fuse-overlayfs")) is not None:
        attempts.append(
            f'[storage]\ndriver = "overlay"\n[storage.options.overlay]\nmount_program = "{fuse}"\n'
        )
    conf.parent.mkdir(parents=True, exist_ok=True)
    header = "# written by `kernelbridge setup`: vfs copies every image for every container\n"
    for text in attempts:
        conf.write_text(header + text)
        _podman("system", "reset", "--force")
        if rootless_storage_driver() == "overlay":
            return "overlay (fuse-overlayfs)" if "mount_program" in text else "overlay"
    conf.unlink()
    _podman("system", "reset", "--force")
    return None


def kernelbridge_command() -> str:
    """The absolute path of this installation's ``kernelbridge`` script (for MCP client configs)."""
    beside = Path(sys.executable).with_name("kernelbridge")
    if beside.exists():
        return str(beside)
    return shutil.which("kernelbridge") or f"{sys.executable} -m kernelbridge.cli"


def run_setup(settings: Settings, packages: list[str]) -> int:
    """Run every step (module docstring); returns the exit status."""
    from kernelbridge.doctor import run_doctor
    from kernelbridge.image import build_image, extras_from_settings
    from kernelbridge.image_build import unshare_problem

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
    if not root:
        if (problem := unshare_problem()) is not None:
            say(problem)
            return 1
        if rootless_storage_driver() == "vfs":
            switched = use_overlay_storage()
            say(
                f"rootless podman's storage was empty and on vfs: switched it to {switched}"
                f" ({_storage_conf()})"
                if switched
                else VFS_WARNING
            )
    check_state_dir(settings)
    say(f"state directory: {settings.state_dir}")
    extras = extras_from_settings(settings).plus(packages)
    executable = "podman" if shutil.which("podman") else "docker"
    try:
        tag = build_image(executable, extras=extras, log=lambda line: say(line))
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
