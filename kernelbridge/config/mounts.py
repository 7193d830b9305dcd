"""Host directories a sandbox may see (``KERNELBRIDGE_MOUNTS``, ``serve --mount``, a notebook's
directory): what may be mounted, where, and why not. No I/O beyond resolving and checking paths.

Every mount is read-only, ``nosuid,nodev,noexec`` and not recursive (``runtime/flags.py`` renders
it); here is what is refused before that: a source that is not a directory, that is the state
directory, holds it or lies inside it (connection keys, tokens, every session's journal), or that
the engines' mount syntax cannot carry; a target that is not absolute or is one of the sandbox's
own paths.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kernelbridge.errors import ConfigError

PACKAGES_DIR = "/packages"
"""Where a sandbox's ``%pip install``s go: a tmpfs of ``SandboxLimits.packages_size``."""
RESERVED_TARGETS = (
    "/tmp", "/workspace", PACKAGES_DIR, "/opt/kernelbridge", "/proc", "/sys", "/dev", "/run", "/var",
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/root",
)  # fmt: skip
"""Paths of the sandbox a host directory is never mounted on (or under): its own mounts and the
system's. ``/workspace/<name>`` is allowed (data beside the kernel's working directory)."""
_MOUNT_PATH = re.compile(r"^/[A-Za-z0-9._/@+-]*$")
"""Characters a mount's paths may have: no ``:`` or ``,``, which the engines' mount syntax splits on."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A host directory the operator grants every sandbox, read-only (``KERNELBRIDGE_MOUNTS``,
    ``serve --mount``): always ``ro,nosuid,nodev,noexec`` and not recursive (see
    ``runtime/flags.py``). Build with :func:`check_mount`, which refuses what must never be mounted."""

    source: Path
    """The host directory, resolved (symlinks followed on the host, once, when it is checked)."""
    target: str
    """Where it appears in the sandbox (absolute)."""

    def __str__(self) -> str:
        return f"{self.source}:{self.target}"


def check_source(source: str | Path, state_dir: Path, *, where: str) -> Path:
    """``source`` resolved, once it may be mounted into a sandbox; ConfigError naming ``where``
    when it is not a directory, is the state directory, inside it or a parent of it (its connection
    files, tokens and other sessions' journals must never be visible in a sandbox), or a path the
    engines cannot spell."""
    raw = str(source)
    try:
        resolved = Path(raw).expanduser().resolve(strict=True)
    except (OSError, RuntimeError):
        raise ConfigError(f"{where}: {raw!r} does not exist (a mount's source must be a directory)") from None
    if not resolved.is_dir():
        raise ConfigError(f"{where}: {raw!r} is not a directory (only directories can be mounted)")
    if not _MOUNT_PATH.match(str(resolved)):
        raise ConfigError(f"{where}: {raw!r} has characters a mount cannot carry (':', ',', spaces)")
    state = state_dir.expanduser().resolve()
    if resolved == state or state.is_relative_to(resolved) or resolved.is_relative_to(state):
        relation = (
            "is the state directory" if resolved == state
            else "holds the state directory" if state.is_relative_to(resolved)
            else "is inside the state directory"
        )  # fmt: skip
        raise ConfigError(
            f"{where}: {raw!r} {relation} ({state}), which holds connection keys, tokens and every"
            " session's journal: it is never mounted into a sandbox"
        )
    return resolved


def check_mount(source: str | Path, target: str, state_dir: Path, *, where: str) -> Mount:
    """A :class:`Mount` of ``source`` at ``target``, or ConfigError naming ``where`` and saying why
    (:func:`check_source`; the target is not absolute, or one of the sandbox's own paths)."""
    resolved = check_source(source, state_dir, where=where)
    normal = os.path.normpath(target) if target.startswith("/") else ""
    if (
        not normal
        or normal != target.rstrip("/")
        or not _MOUNT_PATH.match(normal)
        or normal == "/"
        or "//" in normal
    ):
        raise ConfigError(f"{where}: {target!r} is not an absolute path in the sandbox (e.g. /data)")
    for reserved in RESERVED_TARGETS:
        if normal == reserved or (normal.startswith(reserved + "/") and reserved != "/workspace"):
            raise ConfigError(
                f"{where}: {target!r} is one of the sandbox's own paths; mount at /data, /mnt/...,"
                " or /workspace/<name>"
            )
    return Mount(resolved, normal)


def parse_mounts(raw: str, state_dir: Path, *, where: str) -> tuple[Mount, ...]:
    """``SRC:DST`` items separated by commas (``~/data:/data,~/models:/models``); ConfigError
    naming ``where`` for a bad one, or for two mounts on one target or one inside another."""
    mounts: list[Mount] = []
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        source, sep, target = item.rpartition(":")
        if not sep or not source:
            raise ConfigError(f"{where}: {item!r} is not SRC:DST (a host directory and a sandbox path)")
        mounts.append(check_mount(source, target, state_dir, where=where))
    return check_mount_set(mounts, where=where)


def check_mount_set(mounts: list[Mount], *, where: str) -> tuple[Mount, ...]:
    """``mounts`` once no two share a target or nest; ConfigError otherwise."""
    for i, first in enumerate(mounts):
        for second in mounts[i + 1 :]:
            a, b = first.target, second.target
            if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                raise ConfigError(f"{where}: the mounts on {a} and {b} overlap; give each its own path")
    return tuple(mounts)
