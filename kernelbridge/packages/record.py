"""The record of one ``%pip install``, as the journal and the notebook keep it. No I/O.

The package service answers a sandbox's ``packages_done`` with it (so it is built on the host,
from the host's own plan: the wheels' names, versions and hashes are the host's, not the
sandbox's word); the session's broker files it under the cell that made it; the journal writes
it into the cell's line (``packages``) and the notebook into the cell's metadata
(``kernelbridge.packages``). A restore or a replay hands the records of a notebook back to the
service (``PackageService.prefer``), which then installs exactly those wheels when the same
requirements are asked for again, from the wheel cache when they are there (no index needed).

Read back from a notebook, a record is untrusted input: :meth:`InstallRecord.from_json` takes
only well-formed fields, bounded, and the service checks every wheel's sha256 again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_WHEELS = 256
MAX_REQUIREMENTS = 64
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FILENAME = re.compile(r"^[A-Za-z0-9._+-]{1,200}\.whl$")


@dataclass(frozen=True, slots=True)
class WheelRecord:
    """One wheel an install brought in."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int
    installed_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "filename": self.filename,
            "sha256": self.sha256,
            "size": self.size,
            "installed_size": self.installed_size,
        }

    @classmethod
    def from_json(cls, raw: object) -> WheelRecord | None:
        """A wheel of a record read back (a notebook may say anything), or None."""
        if not isinstance(raw, dict):
            return None
        name, version, filename, sha256 = (raw.get(key) for key in ("name", "version", "filename", "sha256"))
        size, installed = raw.get("size", 0), raw.get("installed_size", 0)
        if not (
            isinstance(name, str)
            and isinstance(version, str)
            and isinstance(filename, str)
            and isinstance(sha256, str)
            and _SHA256.match(sha256)
            and _FILENAME.match(filename)
            and len(name) <= 100
            and len(version) <= 64
        ):
            return None
        sizes = [
            value if isinstance(value, int) and not isinstance(value, bool) else 0
            for value in (size, installed)
        ]
        return cls(name, version, filename, sha256, max(sizes[0], 0), max(sizes[1], 0))


@dataclass(frozen=True, slots=True)
class InstallRecord:
    """One install: what was asked for and what came in (or why nothing did)."""

    requirements: tuple[str, ...]
    """As the host re-rendered them (``packaging``'s canonical form)."""
    installed: tuple[WheelRecord, ...] = ()
    ok: bool = True
    error: str | None = None
    """Why the sandbox did not install it (``ok`` false)."""
    source: str = ""
    """Where the host found the wheels: ``index`` (resolved now), ``cache`` (a stored resolution),
    ``recorded`` (a notebook's record, in a restore or replay), or the cache while the index was
    down."""

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "requirements": list(self.requirements),
            "installed": [wheel.to_json() for wheel in self.installed],
            "ok": self.ok,
            "source": self.source,
        }
        if self.error is not None:
            entry["error"] = self.error
        return entry

    @classmethod
    def from_json(cls, raw: object) -> InstallRecord | None:
        """A record read back (from the service's answer, a journal or a notebook), or None."""
        if not isinstance(raw, dict):
            return None
        requirements = raw.get("requirements")
        installed = raw.get("installed")
        if not isinstance(requirements, list) or not isinstance(installed, list):
            return None
        wheels = [WheelRecord.from_json(item) for item in installed[:MAX_WHEELS]]
        error, source = raw.get("error"), raw.get("source")
        return cls(
            tuple(str(item)[:200] for item in requirements[:MAX_REQUIREMENTS] if isinstance(item, str)),
            tuple(wheel for wheel in wheels if wheel is not None),
            ok=raw.get("ok") is True,
            error=str(error)[:2000] if error is not None else None,
            source=source[:60] if isinstance(source, str) else "",
        )

    def summary(self) -> dict[str, Any]:
        """What a ``run_python`` result shows of it (``structuredContent.packages``)."""
        return {
            "requirements": list(self.requirements),
            "installed": [f"{wheel.name}=={wheel.version}" for wheel in self.installed],
            "ok": self.ok,
            "source": self.source,
        }


def records_of(raw: object, limit: int = 256) -> list[InstallRecord]:
    """The install records of a journal line's or a notebook cell's ``packages`` (untrusted)."""
    if not isinstance(raw, list):
        return []
    records = [InstallRecord.from_json(item) for item in raw[:limit]]
    return [record for record in records if record is not None]
