"""A backend's engine info, kept: in memory for the several asks of one start (:class:`InfoCache`),
and for a local podman on disk for this user's other processes (:class:`InfoStore`:
``engine-info.json`` in ``$XDG_CACHE_HOME/kernelbridge/``, else ``~/.cache/kernelbridge/``).

podman spends 0.3-0.8 CPU-seconds on each answer (package lookups, a CPU sample), and every bridge,
kernelspec tunnel and CLI command asks at start. What is read of it changes only with podman, its
configuration, the user or the boot: it is kept on disk under a key of exactly those
(:meth:`InfoStore.key`), for :data:`STORE_TTL` at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from kernelbridge.runtime.base import RuntimeInfo
from kernelbridge.runtime.cli.podman import podman_config_files

# Which engines keep their info on disk is their openers' choice (engine/connect.py: a unix socket
# or the bridge's own service; select.py: the podman CLI): a remote engine's configuration is not
# on this machine's disk to stamp, and docker answers /info from memory (nothing to save).
# Trust: ``limits_enforced`` decides whether sandboxes whose limits would be ignored are refused
# (host/policy.py), so only a file of this user's, in a directory no one else may write, is read,
# and it is parsed strictly (exact fields, exact types). Any failure (a read-only home, garbage,
# another format, two writers racing) means "ask the engine", never an error.

log = logging.getLogger(__name__)

INFO_TTL = 10.0
"""Seconds an engine's info is taken as still true in one process (a daemon reconfigured meanwhile
is seen at the next ask after that; limits and image are checked again at each call while they
refuse)."""
FORMAT = 1
"""The file's layout; a file of another one is ignored (and replaced at the next save)."""
FILE_NAME = "engine-info.json"
STORE_TTL = 600.0
"""Seconds a kept info is used at most: the backstop for what the key cannot see (a drop-in
file edited in place, a remote engine behind a local socket reconfigured)."""
MAX_ENTRIES = 8
"""Infos kept at once (a system socket, the own service, the CLI, their versions); oldest go first."""
MAX_BYTES = 64 * 1024
"""A file past this is not ours: MAX_ENTRIES entries take about 3 KiB."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""Changes at each boot: the cgroup version and the controllers delegated change only then."""

_KEPT: dict[str, type] = {
    "engine": str,
    "version": str,
    "rootless": bool,
    "cgroup_version": str,
    "oci_runtime": str,
    "limits_enforced": bool,
    "storage_driver": str,
    "reattach": bool,
}
"""The fields of :class:`RuntimeInfo` kept, and their types; ``name`` and ``endpoint`` are the
reading backend's own (the own service's socket is another one at each start)."""

Entries = dict[str, tuple[float, dict[str, Any]]]
"""Key -> (when it was saved, epoch seconds; the kept fields)."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """This user's kernelbridge cache directory (XDG: a relative ``XDG_CACHE_HOME`` is ignored)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "kernelbridge"


def _stamp(path: str) -> tuple[int, int] | None:
    """``(mtime_ns, size)`` of ``path``; None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_mtime_ns, st.st_size


@dataclass(frozen=True, slots=True)
class InfoStore:
    """Where one backend keeps its local podman's info, and what its key holds besides this
    machine's facts: its opener says which podman (``where``, ``executable``, ``oci_runtime``),
    the backend adds its ``name``, ``endpoint`` and ``version`` (:meth:`with_backend`)."""

    where: str
    """Which podman of this machine: ``socket:<path>``, ``service`` (a bridge's own ``podman
    system service``: its socket is a new one each time) or ``cli``; the latter two are told
    apart by their ``executable``."""
    oci_runtime: str | None = None
    """The OCI runtime forced on podman's command line, if any."""
    executable: str | None = None
    """The podman executable run (its real path and stamp are in the key); None: ``podman`` on
    PATH (a socket's service, whose executable we cannot see: likely that one)."""
    name: str = ""
    """The backend's name: a kept info is this backend's, whichever process saved it."""
    endpoint: str = ""
    """The backend's endpoint, likewise."""
    version: str = ""
    """podman's version as its ping said (the CLI's: empty, its executable's stamp stands for it)."""
    directory: Path | None = None
    """None: :func:`cache_dir`."""
    clock: Callable[[], float] = time.time
    """Wall-clock seconds: another process compares them."""
    uid: int = field(default_factory=os.geteuid)
    """The user in the key (the file's owner is checked against the process's own)."""
    boot_file: Path = BOOT_ID

    @property
    def file(self) -> Path:
        return (self.directory or cache_dir()) / FILE_NAME

    def key(self) -> str | None:
        """A digest of everything the info depends on, stamped now; None (keep nothing) when the
        boot cannot be told."""
        try:
            boot = self.boot_file.read_text().strip()
        except OSError:
            return None
        executable = os.path.realpath(self.executable or shutil.which("podman") or "/nonexistent")
        stamps = [(path, _stamp(path)) for path in (executable, *podman_config_files())]
        parts = [FORMAT, self.where, self.version, self.uid, boot, self.oci_runtime or "", stamps]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def lookup(self) -> tuple[str | None, RuntimeInfo | None]:
        """The current key, and the info kept under it within :data:`STORE_TTL` as this backend's
        (None: none, or anything failed: this only spares an ask, it never fails one). The key is
        stamped before the engine is asked, and its answer is kept under it (:meth:`keep`): an
        answer is never filed under a configuration edited while podman answered."""
        key = None
        try:
            key = self.key()
            entry = _entries(self.file).get(key) if key is not None else None
            if entry is None or not 0 <= self.clock() - entry[0] < STORE_TTL:
                return key, None
            return key, RuntimeInfo(name=self.name, endpoint=self.endpoint, **entry[1])
        except Exception as exc:  # a HOME without a home, ...: ask the engine
            log.debug("kept engine info not read: %s", exc)
            return key, None

    def keep(self, key: str | None, info: RuntimeInfo) -> None:
        """Keep ``info`` under ``key`` (None: nothing is kept), with the other fresh entries, at
        most :data:`MAX_ENTRIES`; any failure leaves the file as it was."""
        if key is None:
            return
        try:
            now = self.clock()
            entries = {k: e for k, e in _entries(self.file).items() if 0 <= now - e[0] < STORE_TTL}
            entries[key] = (now, {name: getattr(info, name) for name in _KEPT})
            newest = sorted(entries.items(), key=lambda item: item[1][0])[-MAX_ENTRIES:]
            kept = {k: {"saved": saved, "info": fields} for k, (saved, fields) in newest}
            _write(self.file, json.dumps({"format": FORMAT, "entries": kept}))
        except Exception as exc:  # a read-only home, a full disk, ...: the next start asks again
            log.debug("engine info not kept: %s", exc)

    def with_backend(self, name: str, endpoint: str, version: str = "") -> InfoStore:
        """This store, for the backend ``name`` at ``endpoint`` (of podman ``version``)."""
        return replace(self, name=name, endpoint=endpoint, version=version)


@dataclass
class InfoCache:
    """A backend's last :class:`RuntimeInfo` and when it was asked: a start asks several times in
    a row (limits, image, re-attach, mounts), and podman takes ~0.4 s and six dpkg-query runs to
    answer each."""

    store: InfoStore | None = None
    """Where the info is also kept for this user's other processes; None: asked in each process
    (a remote engine, docker)."""
    _last: tuple[float, RuntimeInfo] | None = None

    async def get(self, ask: Callable[[], Awaitable[RuntimeInfo]]) -> RuntimeInfo:
        """The info asked within :data:`INFO_TTL`, else the one kept in ``store``, else ``await
        ask()``'s (then kept in both)."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < INFO_TTL:
            return self._last[1]
        store = self.store
        # A few stats and a small file, off the event loop: a home on NFS may stall.
        key, info = await anyio.to_thread.run_sync(store.lookup) if store is not None else (None, None)
        if info is None:
            info = await ask()
            if store is not None:
                await anyio.to_thread.run_sync(store.keep, key, info)
        self._last = (now, info)
        return info


def forget(directory: Path | None = None) -> None:
    """Drop every kept info (``doctor``: the next ask of any process goes to the engine)."""
    with contextlib.suppress(OSError):
        ((directory or cache_dir()) / FILE_NAME).unlink()


def _private(st: os.stat_result) -> bool:
    """Owned by this user, and no one else may write to it."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read(file: Path) -> bytes | None:
    try:
        if not _private(os.stat(file.parent)):
            return None
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > MAX_BYTES:
            return None
        return f.read(MAX_BYTES + 1)


def _entries(file: Path) -> Entries:
    """The file's entries, parsed strictly; {} when anything in it is not as written here."""
    try:
        raw = _read(file)
        data = json.loads(raw) if raw is not None else None
    except (OSError, ValueError, RecursionError) as exc:
        log.debug("engine info in %s not read: %s", file, exc)
        return {}
    if not isinstance(data, dict) or set(data) != {"format", "entries"}:
        return {}
    if type(data["format"]) is not int or data["format"] != FORMAT or not isinstance(data["entries"], dict):
        return {}
    found: Entries = {}
    for key, entry in data["entries"].items():
        if not isinstance(entry, dict) or set(entry) != {"saved", "info"}:
            return {}
        saved, info = entry["saved"], entry["info"]
        if type(saved) not in (int, float) or not isinstance(info, dict) or set(info) != set(_KEPT):
            return {}
        if any(type(info[name]) is not kind for name, kind in _KEPT.items()) or info["engine"] != "podman":
            return {}
        found[key] = (float(saved), info)
    return found


def _nearest(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _write(file: Path, text: str) -> None:
    """Write ``text`` to ``file`` atomically (a temp file beside it, renamed over it), in a
    directory of this user's alone (made 0700)."""
    if os.geteuid() == 0 and os.stat(_nearest(file.parent)).st_uid != 0:
        # root with another user's HOME (sudo keeping it): a directory of root's there would be
        # one that user can neither use nor remove.
        raise PermissionError(f"{file.parent} would be root's in a tree of another user's")
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _private(os.stat(file.parent)):
        raise PermissionError(f"{file.parent} is not this user's alone")
    fd, temp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=file.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
