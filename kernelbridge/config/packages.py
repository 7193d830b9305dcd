"""``%pip install`` through the host: its settings (read by ``config.load_settings``). No I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelbridge.errors import ConfigError

_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class PackageSettings:
    """``%pip install`` through the host (see ``kernelbridge/packages/``)."""

    policy: str = "any"
    """``KERNELBRIDGE_PACKAGES``: ``any`` (what the host's pip index serves as wheels), ``none``
    (installing is off: the index learns nothing), or allowed names (comma- or space-separated,
    normalized: the names the sandbox may ask for; their dependencies come with them)."""
    allowed: frozenset[str] = frozenset()
    """The allowed names when ``policy`` is ``names``."""
    max_bytes: int = 128 * 1024**2
    """``KERNELBRIDGE_PACKAGES_MAX_BYTES``: bytes one sandbox may install (unpacked); the /packages
    tmpfs is sized for it plus the wheel being unpacked (:func:`tmpfs_size`)."""
    max_installs: int = 32
    """``KERNELBRIDGE_PACKAGES_MAX_INSTALLS``: ``%pip install`` commands that install something, per
    sandbox."""
    cache_bytes: int = 4 * 1024**3
    """``KERNELBRIDGE_PACKAGES_CACHE``: bytes of wheels the host's cache keeps (least recently used
    go first)."""


def tmpfs_size(max_bytes: int) -> str:
    """The /packages tmpfs for a cap of ``max_bytes``: the cap and half as much again, for the one
    wheel the kernel holds while it unpacks it (each is removed once unpacked). An install whose
    wheel is bigger than that fails cleanly (no space left), nothing installed."""
    return f"{max(max_bytes * 3 // 2 // 1024**2, 16)}m"


def parse_policy(var: str, raw: str) -> tuple[str, frozenset[str]]:
    """``KERNELBRIDGE_PACKAGES``'s value as (policy, allowed names). Raises ConfigError."""
    if raw.lower() == "any":
        return "any", frozenset()
    if raw.lower() == "none":
        return "none", frozenset()
    names = [item for item in re.split(r"[\s,]+", raw) if item]
    bad = [item for item in names if not _PACKAGE_NAME.match(item)]
    if bad or not names:
        shown = bad[0][:60] if bad else raw[:60]
        raise ConfigError(f"{var}: {shown!r} is not a package name (expected any, none, or names)")
    return "names", frozenset(re.sub(r"[-_.]+", "-", name).lower() for name in names)
