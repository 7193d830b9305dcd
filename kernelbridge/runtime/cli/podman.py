"""podman on this machine: facts that decide how it must be driven (read from files, fast), and
the one chore ``kernelbridge setup`` does to a rootless podman (its storage driver).

This module speaks for the *local* podman, whatever runtime a bridge selected: the cgroup layout
and the OCI runtime decide how our own podman processes are started, and the storage driver is
this user's podman configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.cli.command import Cli


def cgroup_layout() -> str:
    """``v2`` (unified), ``hybrid`` (v1 controllers plus a unified hierarchy) or ``v1``."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "unified").is_dir():
        return "hybrid"
    return "v1"


def default_oci_runtime() -> str | None:
    """crun fails to create containers on hybrid cgroup hierarchies; use runc there.

    Returns ``runc`` when crun is installed (so podman may pick it), the layout is hybrid and
    runc exists; forcing runc where podman would have picked it anyway is harmless. Decided
    from files alone: asking ``podman info`` costs ~0.4 s on every sandbox start.
    """
    if cgroup_layout() == "hybrid" and shutil.which("crun") and shutil.which("runc"):
        return "runc"
    return None


# -- rootless storage ------------------------------------------------------------------------------------
VFS_WARNING = (
    "rootless podman uses the vfs storage driver, which copies the whole image for every sandbox"
    " (seconds per start); switch to overlay: `podman system reset` (removes your podman images and"
    ' containers), then put `[storage]` / `driver = "overlay"` in ~/.config/containers/storage.conf'
)
STORAGE_TIMEOUT = 60.0
"""Bound of `podman info` and `podman system reset` (a reset of an empty storage takes a second)."""


def user_config_dir() -> Path:
    """This user's podman configuration directory (``$XDG_CONFIG_HOME/containers``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "containers"


def rootless_storage_conf() -> Path:
    """This user's podman storage configuration file."""
    return user_config_dir() / "storage.conf"


def podman_config_files() -> list[str]:
    """The files (and drop-in directories) of podman's configuration, whether they exist or not."""
    found = [
        f"{root}/{name}"
        for root in ("/etc/containers", "/usr/share/containers", str(user_config_dir()))
        for name in ("containers.conf", "storage.conf", "containers.conf.d")
    ]
    variables = ("CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE", "CONTAINERS_STORAGE_CONF")
    return found + [os.environ[v] for v in variables if os.environ.get(v)]


async def use_overlay_storage() -> str | None:
    """Switch this user's rootless podman from vfs to overlay (native, else fuse-overlayfs) while
    its storage is still empty; returns the driver that now works, or None (nothing was left
    changed: podman missing, a storage.conf of the user's own, or images or containers that a
    reset would remove). Run it with no podman service of ours running: one would keep the old
    storage open."""
    podman = shutil.which("podman")
    if podman is None or os.geteuid() == 0:
        return None
    cli = Cli("podman", podman)
    conf = rootless_storage_conf()
    if conf.exists() or not await _storage_is_empty(cli):
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
        await _reset(cli)
        if await _driver(cli) == "overlay":
            return "overlay (fuse-overlayfs)" if "mount_program" in text else "overlay"
    conf.unlink()
    await _reset(cli)
    return None


async def _storage_is_empty(cli: Cli) -> bool:
    try:
        store = json.loads(await cli.run("info", "--format", "json", timeout=STORAGE_TIMEOUT)).get(
            "store", {}
        )
    except (RuntimeUnavailable, ValueError):
        return False
    return not store.get("imageStore", {}).get("number") and not store.get("containerStore", {}).get("number")


async def _driver(cli: Cli) -> str | None:
    try:
        out = await cli.run("info", "--format", "{{.Store.GraphDriverName}}", timeout=STORAGE_TIMEOUT)
    except RuntimeUnavailable:
        return None
    return out.strip()


async def _reset(cli: Cli) -> None:
    with contextlib.suppress(RuntimeUnavailable):
        await cli.run("system", "reset", "--force", timeout=STORAGE_TIMEOUT)
