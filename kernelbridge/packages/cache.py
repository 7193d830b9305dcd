"""The wheel cache in the state directory, shared by every session (and bridge) on it.

Layout under ``<state dir>/packages/``::

    wheels/<sha256>.whl    a wheel, named by the sha256 of its bytes (content-addressed)
    wheels/<sha256>.json   what it is: {filename, name, version, size, installed_size}
    resolutions/<key>.json what pip resolved for one set of requirements and constraints
    downloads/             pip downloads in progress (each in a directory of its own)

A wheel enters only through :meth:`WheelCache.add`, which checks it: its sha256 is the one the
resolution gave (the index's own hash), its name is the file name pip resolved, it is a zip whose
members are all relative paths inside it, and its unpacked size is counted from the zip's
directory (what it will take in the sandbox). Files are written under a temporary name and renamed,
so a reader never sees half a wheel; every process on the state directory can read while another
adds or prunes. The cache is bounded (:attr:`WheelCache.max_bytes`): past it the least recently
used wheels go (their mtime is touched on use).

Resolutions are kept per set of requirements (a few each, newest first) for :data:`FRESH_FOR`
seconds: within that the same install needs no pip at all, which is how a cached install is "well
under a second"; an older one is used only when the index cannot be reached ("offline when
cached"). A stored resolution fits a sandbox when none of its wheels is a distribution the sandbox
has at another version (unless it was asked for): it was closed under its dependencies, so what
the sandbox has of other names does not matter.
Blocking I/O: callers run these methods in a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from kernelbridge.packages.pip import Resolved

FRESH_FOR = 24 * 3600.0
"""Seconds a resolution is reused without asking the index again (``%pip install -U`` asks anyway)."""
MAX_INSTALLED_BYTES = 4 * 1024**3
"""A wheel that unpacks to more than this is refused whatever the caps (a zip bomb, or not for a sandbox)."""
READ_BLOCK = 1024 * 1024


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


class WheelCache:
    """Wheels and resolutions on disk (see the module docstring)."""

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
        """The cached wheel with this hash, or None (touched: it was just used)."""
        try:
            path = self.path(sha256)
            info = json.loads((self.wheels / f"{sha256}.json").read_text())
            os.utime(path)  # raises if the wheel itself is gone (pruned meanwhile)
            return CachedWheel(**info)
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
        """Check ``file`` (a download of ``expected``) and move it into the cache. Raises CacheError."""
        self._prepare()
        if file.name != expected.filename:
            raise CacheError(f"the index served {file.name[:80]} where {expected.filename[:80]} was resolved")
        digest = hashlib.sha256()
        size = 0
        with file.open("rb") as stream:
            while block := stream.read(READ_BLOCK):
                digest.update(block)
                size += len(block)
        sha256 = digest.hexdigest()
        if expected.sha256 and sha256 != expected.sha256:
            raise CacheError(f"{expected.filename} does not have the sha256 the index gave; not used")
        installed = installed_size(file)
        wheel = CachedWheel(sha256, expected.filename, expected.name, expected.version, size, installed)
        target = self.path(sha256)
        os.replace(file, target)
        _write_json(self.wheels / f"{sha256}.json", asdict(wheel))
        return wheel

    def read(self, sha256: str, offset: int, length: int) -> bytes:
        """``length`` bytes of a cached wheel from ``offset``. Raises CacheError when it is gone."""
        try:
            with self.path(sha256).open("rb") as stream:
                stream.seek(offset)
                return stream.read(length)
        except OSError:
            raise CacheError("the wheel left the host's cache meanwhile; install again") from None

    def download_dir(self) -> Path:
        """A fresh directory for one download (removed by the caller)."""
        self._prepare()
        return Path(tempfile.mkdtemp(prefix="dl-", dir=self.downloads))

    def prune(self) -> int:
        """Remove the least recently used wheels past :attr:`max_bytes`; returns how many went."""
        entries = []
        for path in self.wheels.glob("*.whl"):
            with contextlib.suppress(OSError):
                info = path.stat()
                entries.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                path.with_suffix(".json").unlink(missing_ok=True)
                total -= size
                removed += 1
        # Downloads abandoned by a bridge that died mid-way (an hour is longer than any download).
        cutoff = time.time() - 3600
        for stale in self.downloads.glob("dl-*"):
            with contextlib.suppress(OSError):
                if stale.stat().st_mtime < cutoff:
                    shutil.rmtree(stale, ignore_errors=True)
        return removed

    def size(self) -> int:
        """Bytes of wheels in the cache."""
        total = 0
        for path in self.wheels.glob("*.whl"):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

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


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
