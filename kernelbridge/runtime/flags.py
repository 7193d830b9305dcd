"""The sandbox's flags, decided once: a :class:`ContainerSpec` as a neutral :class:`SandboxFlags`.

Every hardening and resource decision is made here, in no engine's words; the renderers
(``cli.backend.create_argv``, ``engine.body.create_body``, ``kube.manifest.pod_manifest``) spell it
mechanically and decide nothing. What an engine cannot spell is not approximated: :func:`unsupported`
says why, and the backend refuses the sandbox with that line. No I/O. Design: docs/design/runtime.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelbridge.config import PACKAGES_DIR
from kernelbridge.runtime.base import ContainerSpec

WORKDIR = "/workspace"
READ_ONLY_TMPFS = "ro,size=64k,mode=755,nosuid,nodev,noexec"
"""Options of the empty, read-only tmpfs mounted over /run and /var/tmp of a read-only sandbox."""
LOG_DRIVER = "none"
"""Nothing reads an engine's log of a sandbox (the tunnel is the only consumer of its stdio), and
both engines' default drivers (docker's json-file, podman's k8s-file) write every byte the kernel
prints to disk. ``none`` still lets us attach; podman's faster ``passthrough`` cannot be used over
the API (it hands the container the stdio of the service process, leaving nothing to attach to)."""

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmg]?)$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size_bytes(size: str) -> int:
    """``512m`` -> 536870912 (binary units, as docker and podman read ``--memory``).

    Raises ValueError on a malformed size (settings validate sizes before they get here).
    """
    match = _SIZE.match(size.strip())
    if not match:
        raise ValueError(f"not a size: {size!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def tmpfs_options(size: str) -> str:
    """Mount options of a writable sandbox tmpfs: sized (unsized, podman's /tmp under --read-only
    is a huge tmpfs counted against the memory limit), world-writable and sticky, no set-uid, no
    devices."""
    return f"rw,size={size},mode=1777,nosuid,nodev"


@dataclass(frozen=True, slots=True)
class Tmpfs:
    """A memory-backed mount of the sandbox."""

    path: str
    size: str
    """As the settings spell it (``64m``): binary units."""
    options: str
    """The mount options, as both CLIs and the engine API take them."""
    covers_engine_default: bool = False
    """Only there to replace an unsized, writable tmpfs that podman's ``--read-only`` adds on its
    own (``--read-only-tmpfs``, on by default) with an empty read-only one. A Pod gets no such
    mounts, so its renderer leaves these out."""


BIND_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "bind")
"""Every host directory is bound read-only, without set-uid programs, devices or executables, and
not recursively (``bind``, not podman's default ``rbind``): a mount below the source (a USB disk
under ~/data) is not carried in, and so cannot escape the read-only flag, which a recursive bind
applies to its top mount only. Symlinks in it are resolved by the sandbox's kernel in the
sandbox's own mount namespace, so a link to ``/etc/passwd`` or ``../../secret`` names a path of the
sandbox, never one of the host."""


@dataclass(frozen=True, slots=True)
class BindMount:
    """A host directory in the sandbox, always read-only (:data:`BIND_OPTIONS`)."""

    source: str
    target: str
    options: tuple[str, ...] = BIND_OPTIONS


@dataclass(frozen=True, slots=True)
class Ulimit:
    name: str
    soft: int
    hard: int


@dataclass(frozen=True, slots=True)
class SandboxFlags:
    """One sandbox container as every renderer needs it (see the module docstring)."""

    image: str
    name: str
    command: tuple[str, ...]
    """Overrides the image's CMD when not empty."""
    labels: dict[str, str]
    env: tuple[tuple[str, str], ...]
    user: str
    """``uid:gid``."""
    network: str
    read_only: bool
    memory: str
    """The memory limit as the settings spell it (``512m``); swap is limited to the same amount,
    so the kernel cannot page out past it."""
    pids: int
    cpus: float
    tmpfs: tuple[Tmpfs, ...]
    binds: tuple[BindMount, ...]
    ulimits: tuple[Ulimit, ...]
    """Explicit: the engines' defaults would be raised past what may be set without
    CAP_SYS_RESOURCE on these machines, and the container would fail to start."""
    stdin_once: bool = True
    """stdin is open for one attachment and closed for good when that client closes it (the
    agent then sees EOF: it exits, or, durable, waits for a bridge to reach it through an exec
    session). Always so: no engine needs another mode (podman 4.3 ignores StdinOnce=false)."""
    workdir: str = WORKDIR
    cap_drop: tuple[str, ...] = ("ALL",)
    no_new_privileges: bool = True
    log_driver: str = LOG_DRIVER
    init: bool = False
    """No init process: the agent runs as PID 1 itself. An init process holding the frame pipes
    would be reachable from kernel code (same uid, ``/proc/1/fd``)."""
    auto_remove: bool = False
    """A sandbox's bridge removes its container itself, so that ``inspect`` can still tell the
    exit code and the OOM flag after the container exited. A durable one (``spec.durable``) may
    end with no bridge there (its idle timeout): the engine removes it then, and
    ``RuntimeBackend.ended`` asks the engine's event log how it ended."""
    pull: bool = False
    """Never reach for a registry: the image is built locally, and a miss must fail fast."""

    @property
    def memory_bytes(self) -> int:
        return size_bytes(self.memory)

    @property
    def uid_gid(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)

    @property
    def network_disabled(self) -> bool:
        return self.network == "none"


def sandbox_flags(spec: ContainerSpec) -> SandboxFlags:
    """The flags of ``spec``'s container."""
    lim = spec.limits
    binds = tuple(BindMount(str(mount.source), mount.target) for mount in spec.mounts)
    tmpfs = [Tmpfs("/tmp", lim.tmp_size, tmpfs_options(lim.tmp_size))]
    if not any(bind.target == WORKDIR for bind in binds):  # a notebook's directory replaces it
        tmpfs.append(Tmpfs(WORKDIR, lim.workspace_size, tmpfs_options(lim.workspace_size)))
    # The session's `%pip install`s (kernelbridge/packages/): writable, and not noexec, because
    # binary wheels are shared libraries the kernel maps executable; /tmp and /workspace are too.
    tmpfs.append(Tmpfs(PACKAGES_DIR, lim.packages_size, tmpfs_options(lim.packages_size)))
    if lim.read_only:
        # podman's --read-only also mounts *unsized* tmpfs on /run and /var/tmp: writable space
        # bounded by nothing but the memory limit, where nobody looks. Mounting them read-only
        # ourselves replaces podman's mounts and says the same thing to docker (which adds none).
        tmpfs += [
            Tmpfs("/var/tmp", "64k", READ_ONLY_TMPFS, covers_engine_default=True),
            Tmpfs("/run", "64k", READ_ONLY_TMPFS, covers_engine_default=True),
        ]
    return SandboxFlags(
        image=spec.image,
        name=spec.name,
        command=spec.command,
        labels=spec.all_labels(),
        env=spec.env,
        user=lim.user,
        network=lim.network,
        read_only=lim.read_only,
        memory=lim.memory,
        pids=lim.pids,
        cpus=lim.cpus,
        tmpfs=tuple(tmpfs),
        binds=binds,
        ulimits=(Ulimit("nofile", lim.nofile, lim.nofile), Ulimit("nproc", lim.nproc, lim.nproc)),
        auto_remove=spec.durable,
    )


def unsupported(engine: str, flags: SandboxFlags) -> str | None:
    """Why ``engine`` cannot run a sandbox with these flags as they say (None: it can)."""
    if engine == "docker" and flags.binds:
        return (
            "docker cannot mount a host directory nosuid,nodev,noexec and non-recursively, as"
            " KERNELBRIDGE_MOUNTS (and a notebook's directory) must be; use podman for mounts"
        )
    return None
