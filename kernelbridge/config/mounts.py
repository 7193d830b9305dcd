"""Host directories a sandbox may see (``KERNELBRIDGE_MOUNTS``, ``serve --mount``, a notebook's
directory): what may be mounted, where, and why not. No I/O beyond resolving paths and looking
into a source for sockets.

Every mount is read-only, ``nosuid,nodev,noexec`` and not recursive (``runtime/flags.py`` renders
it). Refused, symlinks resolved first: a source that is not a directory; that is, holds or lies
inside a path that exposes the host (the list and the reasons: README.md, "Packages and data");
that is or holds ``/tmp``; that holds a unix socket in its first :data:`SOCKET_SCAN_ENTRIES`
entries (one created there after the bridge started is reachable); or that the engines' mount
syntax cannot carry. A target is refused when it is not absolute or is one of the sandbox's own paths.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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

HOST_PATHS: dict[str, str] = {
    "/proc": "the host's processes (every command line, host MCP servers' with their tokens)",
    "/sys": "the host's kernel and devices",
    "/dev": "the host's devices",
    "/etc": "the host's configuration and password hashes",
    "/root": "root's home and credentials",
    "/boot": "the host's kernels",
    "/run": "the host's runtime sockets (an engine's socket is connectable even read-only)",
    "/var/run": "the host's runtime sockets (an engine's socket is connectable even read-only)",
    "/var/log": "the host's logs",
    "/var/lib/containers": "podman's storage (every container's files)",
    "/var/lib/docker": "docker's storage (every container's files)",
    "/var/lib/containerd": "containerd's storage (every container's files)",
    "/var/lib/kubelet": "the kubelet's pods and their secrets",
}
"""Paths that expose the host, refused as a source, as a source's parent, and inside."""
SHARED_PATHS: dict[str, str] = {
    "/tmp": "every user's temporary files and sockets",
    "/var/tmp": "every user's temporary files",
}
"""Paths refused as a source and as a source's parent, but not inside (a directory of one's own
in /tmp may be mounted: the socket search still applies)."""
HOME_PATHS: dict[str, str] = {
    ".ssh": "ssh keys",
    ".gnupg": "gpg keys",
    ".aws": "cloud credentials",
    ".azure": "cloud credentials",
    ".kube": "cluster credentials",
    ".docker": "docker's credentials and sockets",
    ".config": "applications' settings and tokens (gh, gcloud, Claude Desktop, MCP servers)",
    ".claude": "Claude Code's settings and credentials",
    ".claude.json": "Claude Code's MCP servers and their API keys",
    ".cursor": "Cursor's MCP servers and their API keys",
    ".vscode": "VS Code's MCP servers",
    "MCPs": "host MCP server definitions and their tokens",
    ".netrc": "passwords",
    ".git-credentials": "passwords",
    ".pypirc": "package index tokens",
    ".password-store": "passwords",
    ".local/share/containers": "rootless podman's storage",
    ".local/share/keyrings": "the desktop's keyring",
}
"""Paths below a user's home (the bridge user's, by ``$HOME`` and by its uid), refused like
:data:`HOST_PATHS`: a home itself holds them, so it is refused too."""
SOCKET_SCAN_ENTRIES = 10_000
"""Entries of a source looked at for unix sockets, breadth first (a few ms): bounded, as a mount
of a big data set must not stall a start."""


@dataclass(frozen=True, slots=True)
class Guarded:
    """A host path no mount may expose."""

    path: Path
    why: str
    inside: bool = True
    """Whether a source inside ``path`` is refused too (False: only ``path`` and its parents)."""


@dataclass(frozen=True, slots=True)
class MountGuard:
    """What no mount source may be, hold or lie inside. Build with :func:`mount_guard`."""

    state_dir: Path
    guarded: tuple[Guarded, ...] = field(default=())


def mount_guard(
    state_dir: Path,
    env: Mapping[str, str],
    *,
    private: Iterable[tuple[Path, str]] = (),
) -> MountGuard:
    """The guard for a bridge on ``state_dir``: :data:`HOST_PATHS`, :data:`SHARED_PATHS`, the
    :data:`HOME_PATHS` of the bridge user's home, ``XDG_RUNTIME_DIR`` and ``XDG_CONFIG_HOME`` of
    ``env``, and the ``private`` paths the settings name (exports, tokens, server configs, an
    engine's socket and certificates), each with why."""
    guarded = [Guarded(Path(path), why) for path, why in HOST_PATHS.items()]
    guarded += [Guarded(Path(path), why, inside=False) for path, why in SHARED_PATHS.items()]
    for home in _homes(env):
        guarded += [Guarded(home / name, why) for name, why in HOME_PATHS.items()]
    if runtime_dir := env.get("XDG_RUNTIME_DIR"):
        guarded.append(Guarded(Path(runtime_dir), "the user's runtime sockets (podman's among them)"))
    if config_home := env.get("XDG_CONFIG_HOME"):
        guarded.append(Guarded(Path(config_home), "applications' settings and tokens"))
    guarded += [Guarded(path, why) for path, why in private]
    return MountGuard(state_dir, tuple(guarded))


def _homes(env: Mapping[str, str]) -> list[Path]:
    homes = [Path(env["HOME"])] if env.get("HOME") else []
    try:
        homes.append(Path(pwd.getpwuid(os.geteuid()).pw_dir))
    except KeyError:
        pass
    return list(dict.fromkeys(home for home in homes if home.is_absolute() and home != Path("/")))


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


def check_source(source: str | Path, guard: MountGuard, *, where: str) -> Path:
    """``source`` resolved, once it may be mounted into a sandbox; ConfigError naming ``where``
    and saying why when it is not a directory, a path the engines cannot spell, the state directory
    (its connection files, tokens and other sessions' journals), a path of ``guard``, a parent of
    one or (mostly) inside one, or holds a unix socket (see the module docstring)."""
    raw = str(source)
    try:
        resolved = Path(raw).expanduser().resolve(strict=True)
    except (OSError, RuntimeError):
        raise ConfigError(f"{where}: {raw!r} does not exist (a mount's source must be a directory)") from None
    if not resolved.is_dir():
        raise ConfigError(f"{where}: {raw!r} is not a directory (only directories can be mounted)")
    if not _MOUNT_PATH.match(str(resolved)):
        raise ConfigError(f"{where}: {raw!r} has characters a mount cannot carry (':', ',', spaces)")
    for guarded in guard.guarded:
        if (meets := _relation(resolved, guarded)) is not None:
            raise ConfigError(
                f"{where}: {raw!r} {meets} {guarded.path} ({guarded.why}): it is never mounted into a sandbox"
            )
    state = guard.state_dir.expanduser().resolve()
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
    if (socket := first_socket(resolved)) is not None:
        raise ConfigError(
            f"{where}: {raw!r} holds a unix socket ({socket}), which a read-only mount does not stop"
            " a sandbox from connecting to: mount a directory without sockets"
        )
    return resolved


def _relation(source: Path, guarded: Guarded) -> str | None:
    """How ``source`` (resolved) meets ``guarded``: "is", "holds", "is inside", or None."""
    for path in dict.fromkeys((guarded.path, _resolved(guarded.path))):
        if source == path:
            return "is"
        if path.is_relative_to(source):
            return "holds"
        if guarded.inside and source.is_relative_to(path):
            return "is inside"
    return None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path


def first_socket(root: Path, limit: int = SOCKET_SCAN_ENTRIES) -> Path | None:
    """The first unix socket below ``root`` (breadth first, at most ``limit`` entries, not
    following symlinks, not into other file systems: the mount is not recursive), or None."""
    try:
        device = root.stat().st_dev
    except OSError:
        return None
    pending, seen = deque([root]), 0
    while pending and seen < limit:
        directory = pending.popleft()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    seen += 1
                    if seen > limit:
                        break
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISSOCK(info.st_mode):
                        return Path(entry.path)
                    if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                        pending.append(Path(entry.path))
        except OSError:
            continue
    return None


def check_mount(source: str | Path, target: str, guard: MountGuard, *, where: str) -> Mount:
    """A :class:`Mount` of ``source`` at ``target``, or ConfigError naming ``where`` and saying why
    (:func:`check_source`; the target is not absolute, or one of the sandbox's own paths)."""
    resolved = check_source(source, guard, where=where)
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


def parse_mounts(raw: str, guard: MountGuard, *, where: str) -> tuple[Mount, ...]:
    """``SRC:DST`` items separated by commas (``~/data:/data,~/models:/models``); ConfigError
    naming ``where`` for a bad one, or for two mounts on one target or one inside another."""
    mounts: list[Mount] = []
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        source, sep, target = item.rpartition(":")
        if not sep or not source:
            raise ConfigError(f"{where}: {item!r} is not SRC:DST (a host directory and a sandbox path)")
        mounts.append(check_mount(source, target, guard, where=where))
    return check_mount_set(mounts, where=where)


def check_mount_set(mounts: list[Mount], *, where: str) -> tuple[Mount, ...]:
    """``mounts`` once no two share a target or nest; ConfigError otherwise."""
    for i, first in enumerate(mounts):
        for second in mounts[i + 1 :]:
            a, b = first.target, second.target
            if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                raise ConfigError(f"{where}: the mounts on {a} and {b} overlap; give each its own path")
    return tuple(mounts)
