"""What a session's sandboxes could reach beyond their code: the host directories mounted in them
and what ``%pip install`` allowed. The journal's header records it (``"sandbox"``), the notebook's
metadata carries it (``metadata.kernelbridge.sandbox``), and a replay compares it with its own
settings, so that it can say up front what the original had and the replay lacks (a cell that
reads ``/data/x.csv`` fails without the mount, and would otherwise only say FileNotFoundError).

Only the mounts' targets are recorded, never their host paths: a notebook reaches the model
(``export_notebook``) and whoever it is shared with. Read back as untrusted (a notebook may come
from anywhere): fields of the wrong type are absent, everything bounded. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kernelbridge.config import Settings

MAX_MOUNTS = 64
MAX_ALLOWED = 256
MAX_PATH_CHARS = 1024
_PACKAGE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,98}[a-z0-9])?$")
"""A normalized package name (``config.packages.parse_policy`` writes them so)."""


@dataclass(frozen=True, slots=True)
class SandboxAccess:
    """The mounts (their targets) and the ``%pip install`` policy a session's sandboxes had."""

    mounts: tuple[str, ...] = ()
    packages: str = "any"
    """``any``, ``none`` or ``names`` (then ``allowed``), as ``KERNELBRIDGE_PACKAGES``."""
    allowed: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Settings) -> SandboxAccess:
        policy = settings.packages
        return cls(tuple(m.target for m in settings.mounts), policy.policy, tuple(sorted(policy.allowed)))

    def to_json(self) -> dict[str, Any]:
        packages: str | list[str] = list(self.allowed) if self.packages == "names" else self.packages
        return {"mounts": list(self.mounts), "packages": packages}

    @classmethod
    def from_json(cls, raw: object) -> SandboxAccess | None:
        """The record of ``raw`` (a header's or a notebook's ``sandbox``), or None if it is none."""
        if not isinstance(raw, dict):
            return None
        mounts = raw.get("mounts")
        targets = tuple(
            m for m in (mounts if isinstance(mounts, list) else [])[:MAX_MOUNTS]
            if isinstance(m, str) and m.startswith("/") and len(m) <= MAX_PATH_CHARS and m.isprintable()
        )  # fmt: skip
        packages = raw.get("packages")
        if isinstance(packages, list):
            names = (p for p in packages[:MAX_ALLOWED] if isinstance(p, str) and _PACKAGE.match(p))
            return cls(targets, "names", tuple(sorted(set(names))))
        return cls(targets, packages if packages in ("any", "none") else "any")

    def lacks(self, now: SandboxAccess) -> Lacking:
        """What of this (the original's) access ``now`` (a replay's) does not give."""
        missing = tuple(target for target in self.mounts if target not in now.mounts)
        if now.packages == "none":
            packages = () if self.packages == "none" else (self.allowed or ("any",))
        elif now.packages == "names":
            packages = ("any",) if self.packages == "any" else tuple(set(self.allowed) - set(now.allowed))
        else:
            packages = ()
        return Lacking(missing, tuple(sorted(packages)), now)


@dataclass(frozen=True, slots=True)
class Lacking:
    """What a replay lacks of the original's access (:meth:`SandboxAccess.lacks`)."""

    mounts: tuple[str, ...] = ()
    """Targets mounted in the original and not in the replay."""
    packages: tuple[str, ...] = ()
    """Package names the original could install and the replay cannot (``("any",)``: any)."""
    now: SandboxAccess | None = None

    def __bool__(self) -> bool:
        return bool(self.mounts or self.packages)

    def mount_of(self, text: str) -> str | None:
        """The missing mount a path in ``text`` (an exception's message) lies in, if any."""
        for target in self.mounts:
            if re.search(rf"(?<![\w/.-]){re.escape(target)}(?:/|['\"\s]|$)", text):
                return target
        return None
