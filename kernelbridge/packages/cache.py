"""The wheel cache in ``<state dir>/packages/``, shared by every session (and bridge) on it.

Wheels named by their sha256, each with its record; resolutions per set of requirements; one
locked work directory per pip run or fetch in progress (the layout, what :meth:`WheelCache.add`
checks, and how a killed bridge leaves nothing a later one trusts: docs/architecture.md,
"Packages and data"). The budget (:attr:`WheelCache.max_bytes`) holds for everything on disk here,
work directories included. A stored resolution is used for :data:`FRESH_FOR` seconds (no pip at
all), an older one only when the index cannot be reached. Blocking I/O: callers run these methods
in a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from kernelbridge.packages.pip import Resolved, disk_usage

FRESH_FOR = 24 * 3600.0
"""Seconds a resolution is reused without asking the index again (``%pip install -U`` asks anyway)."""
MAX_INSTALLED_BYTES = 4 * 1024**3
"""A wheel that unpacks to more than this is refused whatever the caps (a zip bomb, or not for a sandbox)."""
READ_BLOCK = 1024 * 1024
OWNER = ".owner"
"""The lock file of a work directory: locked by the bridge that works there, holding what it reserved."""
STRAY_AFTER = 60.0
"""Seconds after which a temporary file, or a work directory without its lock, is a leftover: each
lives for milliseconds (a rename, a mkdtemp before its lock) unless its writer died."""


class CacheError(Exception):
    """A wheel failed a check (hash, name, zip, size); the message is one line."""


@dataclass(frozen=True, slots=True)
class CachedWheel:
    """A wheel in the cache."""

    sha256: str
    filename: str
    name: str
    version: str
    size: int
    """Bytes of the wheel file."""
    installed_size: int
    """Bytes it unpacks to (the sum of its members' sizes)."""


KEEP_RESOLUTIONS = 8
"""Resolutions kept per set of requirements (sandboxes with different packages get different ones)."""


def resolution_key(requirements: list[str], target: tuple[str, ...]) -> str:
    """A name for one set of requirements on one platform (their order does not matter)."""
    text = json.dumps({"r": sorted(requirements), "t": list(target)})
    return hashlib.sha256(text.encode()).hexdigest()


def fits(wheels: list[Resolved], constraints: dict[str, str], asked: set[str]) -> bool:
    """Whether a resolution fits a sandbox with ``constraints`` (its distributions): no wheel is
    one of them at another version, but the names ``asked`` for."""
    return all(w.name in asked or constraints.get(w.name, w.version) == w.version for w in wheels)


@dataclass(slots=True)
class WorkDir:
    """A directory of ``downloads/`` that one pip run or fetch works in, locked while it does."""

    path: Path
    _lock: int

    def release(self) -> None:
        """Remove the directory and what is in it, then let go of the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._lock)


class WheelCache:
    """Wheels and resolutions on disk (docs/architecture.md, "Packages and data")."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.wheels = root / "wheels"
        self.resolutions = root / "resolutions"
        self.downloads = root / "downloads"

    def __repr__(self) -> str:
        return f"<WheelCache {self.root} max={self.max_bytes}>"

    def _prepare(self) -> None:
        for directory in (self.root, self.wheels, self.resolutions, self.downloads):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- wheels ------------------------------------------------------------------------------------
    def path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(ch not in "0123456789abcdef" for ch in sha256):
            raise CacheError("not a sha256")
        return self.wheels / f"{sha256}.whl"

    def get(self, sha256: str) -> CachedWheel | None:
        """The cached wheel with this hash, or None (touched: it was just used). A wheel whose size
        is not its record's (cut short by a crash) is not one."""
        try:
            path = self.path(sha256)
            wheel = CachedWheel(**json.loads((self.wheels / f"{sha256}.json").read_text()))
            if path.stat().st_size != wheel.size or wheel.sha256 != sha256:
                return None
            os.utime(path)
            return wheel
        except (OSError, ValueError, TypeError, CacheError):
            return None

    def find(self, name: str, version: str) -> CachedWheel | None:
        """A cached wheel of ``name`` ``version`` (for pins recorded without a usable hash)."""
        for meta in self.wheels.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                info = json.loads(meta.read_text())
                if info.get("name") == name and info.get("version") == version:
                    found = self.get(str(info.get("sha256")))
                    if found is not None:
                        return found
        return None

    def add(self, file: Path, expected: Resolved) -> CachedWheel:
        """Check ``file`` (a download of ``expected``, in a work directory) and move it into the
        cache. Raises CacheError."""
        self._prepare()
        if file.name != expected.filename:
            raise CacheError(f"the index served {file.name[:80]} where {expected.filename[:80]} was resolved")
        digest = hashlib.sha256()
        size = 0
        with file.open("rb") as stream:
            while block := stream.read(READ_BLOCK):
                digest.update(block)
                size += len(block)
            os.fsync(stream.fileno())
        sha256 = digest.hexdigest()
        if expected.sha256 and sha256 != expected.sha256:
            raise CacheError(f"{expected.filename} does not have the sha256 the index gave; not used")
        installed = installed_size(file)
        wheel = CachedWheel(sha256, expected.filename, expected.name, expected.version, size, installed)
        _write_json(self.wheels / f"{sha256}.json", asdict(wheel))
        os.replace(file, self.path(sha256))
        return wheel

    def read(self, sha256: str, offset: int, length: int) -> bytes:
        """``length`` bytes of a cached wheel from ``offset``. Raises CacheError when it is gone."""
        try:
            with self.path(sha256).open("rb") as stream:
                stream.seek(offset)
                return stream.read(length)
        except OSError:
            raise CacheError("the wheel left the host's cache meanwhile; install again") from None

    # -- the budget --------------------------------------------------------------------------------
    def claim(self, reserve: int) -> WorkDir:
        """A fresh work directory in ``downloads/``, locked, counted as at least ``reserve`` bytes
        by every footprint until it is released."""
        self._prepare()
        path = Path(tempfile.mkdtemp(prefix="dl-", dir=self.downloads))
        lock = os.open(path / OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(lock, str(max(reserve, 0)).encode())
        return WorkDir(path, lock)

    def footprint(self) -> int:
        """Bytes this cache takes on disk: wheels, records, resolutions, and each live work
        directory at least at what it reserved (stale ones are removed on the way)."""
        total = sum(_sizes(self.wheels.glob("*"))) + sum(_sizes(self.resolutions.glob("*")))
        for work in self._work_dirs():
            total += max(_reservation(work), disk_usage(work))
        return total

    def room(self) -> int:
        """Bytes the budget has left now."""
        return max(0, self.max_bytes - self.footprint())

    def make_room(self, need: int, keep: Iterable[str] = ()) -> int:
        """Remove least recently used wheels (none of ``keep``, sha256s installs hold) until
        ``need`` more bytes fit in the budget; the bytes that fit now, at most ``need``."""
        self._prepare()
        kept = set(keep)
        used = self.footprint()
        for path in self._by_age():
            if used + need <= self.max_bytes:
                break
            if path.stem not in kept:
                used -= self._remove(path)
        return max(0, min(need, self.max_bytes - used))

    def prune(self, keep: Iterable[str] = ()) -> int:
        """Remove the least recently used wheels (none of ``keep``) past :attr:`max_bytes`, and the
        leftovers of bridges that died; returns how many wheels went."""
        self._prepare()
        kept = set(keep)
        now = time.time()
        for stray in [*self.wheels.glob(".*.tmp"), *self.resolutions.glob(".*.tmp")]:
            with contextlib.suppress(OSError):
                if now - stray.stat().st_mtime > STRAY_AFTER:
                    stray.unlink()
        used = self.footprint()
        removed = 0
        for path in self._by_age():
            if used <= self.max_bytes:
                break
            freed = self._remove(path) if path.stem not in kept else 0
            if freed:
                used -= freed
                removed += 1
        return removed

    def size(self) -> int:
        """Bytes of wheels in the cache."""
        return sum(_sizes(self.wheels.glob("*.whl")))

    def _by_age(self) -> list[Path]:
        """The wheels, least recently used first."""
        entries = []
        for path in self.wheels.glob("*.whl"):
            with contextlib.suppress(OSError):
                entries.append((path.stat().st_mtime, path))
        return [path for _, path in sorted(entries)]

    def _remove(self, wheel: Path) -> int:
        """Remove a wheel and its record; the bytes that freed (0: it was gone already)."""
        record = wheel.with_suffix(".json")
        freed = sum(_sizes([wheel, record]))
        try:
            wheel.unlink()
        except OSError:
            return 0
        record.unlink(missing_ok=True)
        return freed

    def _work_dirs(self) -> list[Path]:
        """The live work directories; the ones whose owner died are removed."""
        live = []
        for work in self.downloads.glob("dl-*"):
            if _abandoned(work):
                shutil.rmtree(work, ignore_errors=True)
            else:
                live.append(work)
        return live

    # -- resolutions -------------------------------------------------------------------------------
    def resolution(
        self, key: str, constraints: dict[str, str], asked: set[str], *, fresh: bool
    ) -> list[Resolved] | None:
        """The newest stored resolution of ``key`` that :func:`fits` (``fresh``: only one younger
        than FRESH_FOR), or None."""
        for created, wheels in self._resolutions(key):
            if fresh and time.time() - created > FRESH_FOR:
                continue
            if fits(wheels, constraints, asked):
                return wheels
        return None

    def _resolutions(self, key: str) -> list[tuple[float, list[Resolved]]]:
        try:
            data = json.loads((self.resolutions / f"{key}.json").read_text())
            return [
                (float(entry["created"]), [Resolved(**item) for item in entry["wheels"]])
                for entry in data["entries"]
            ]
        except (OSError, ValueError, TypeError, KeyError):
            return []

    def store_resolution(self, key: str, wheels: list[Resolved]) -> None:
        """Keep a resolution of ``key``, newest first (at most KEEP_RESOLUTIONS; an identical one
        moves to the front)."""
        self._prepare()
        kept = [(created, old) for created, old in self._resolutions(key) if old != wheels]
        entries = [(time.time(), wheels), *kept][:KEEP_RESOLUTIONS]
        data = {"entries": [{"created": c, "wheels": [asdict(w) for w in ws]} for c, ws in entries]}
        _write_json(self.resolutions / f"{key}.json", data)


def installed_size(file: Path) -> int:
    """What a wheel unpacks to, from its zip directory; CacheError if it is not a safe wheel."""
    try:
        with zipfile.ZipFile(file) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        raise CacheError(f"{file.name[:80]} is not a valid wheel (not a zip file)") from None
    total = 0
    for member in members:
        name = member.filename
        if name.startswith(("/", "\\")) or ".." in Path(name).parts or ":" in name.split("/", 1)[0]:
            raise CacheError(f"{file.name[:80]} holds a path outside itself ({name[:80]}); refused")
        total += member.file_size
    if total > MAX_INSTALLED_BYTES:
        raise CacheError(f"{file.name[:80]} unpacks to {total:,} bytes; refused")
    return total


def _sizes(paths: Iterable[Path]) -> Iterable[int]:
    for path in paths:
        with contextlib.suppress(OSError):
            yield path.stat().st_size


def _reservation(work: Path) -> int:
    """What a live work directory reserved (0 while its owner is still writing it)."""
    try:
        return int((work / OWNER).read_text() or 0)
    except (OSError, ValueError):
        return 0


def _abandoned(work: Path) -> bool:
    """Whether ``work``'s owner is gone: its lock is free (flock locks die with their process), or
    it never had one past :data:`STRAY_AFTER`."""
    try:
        lock = os.open(work / OWNER, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - work.stat().st_mtime > STRAY_AFTER
        return False
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: someone works there
    else:
        return True
    finally:
        os.close(lock)


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as stream:
        stream.write(json.dumps(value))
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, path)
