"""Helpers of the install tests: building, running commands, the unprivileged test user
(conftest.py says what the fixtures cache and why)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST_FILE = "kernelbridge_mcp"
"""How the distribution's files begin (PEP 625/427: ``kernelbridge-mcp`` normalized)."""
BUILD_TIMEOUT = 600
PIP_TIMEOUT = 900
TEST_USER = "kb-nonroot"
SUBID_COUNT = 65536
# Where a missing subordinate id range is put when useradd did not allocate one: far above
# useradd's defaults (100000 + n * 65536), so it cannot overlap ranges of other users.
SUBID_BASE = 1_700_000_000
USER_PYTHON = "/usr/bin/python3"
"""The interpreter an unprivileged user can run (the checkout's may live under /root)."""


def run(argv: list[str], *, timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; on failure, fail the test with the end of its output."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        pytest.fail(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{output}")
    return proc


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path
    """Built from the sdist (as pipx or uv would build it), not from the tree."""

    def digest(self) -> str:
        """A hash of the wheel's files (not of the archive, whose timestamps change every build)."""
        digest = hashlib.sha256()
        with zipfile.ZipFile(self.wheel) as wheel:
            for name in sorted(wheel.namelist()):
                digest.update(name.encode() + b"\0" + wheel.read(name))
        return digest.hexdigest()[:12]

    def requirements_digest(self) -> str:
        """A hash of what installing the wheel pulls in (its ``Requires-Dist`` and
        ``Provides-Extra`` lines): equal for two builds whose code differs but whose dependencies
        do not, so a virtualenv of the one serves the other once the wheel itself is replaced."""
        with zipfile.ZipFile(self.wheel) as wheel:
            (metadata,) = (name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
            lines = wheel.read(metadata).decode().splitlines()
        wanted = sorted(line for line in lines if line.startswith(("Requires-Dist:", "Provides-Extra:")))
        return hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:12]


# -- the unprivileged user ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TestUser:
    """The unprivileged user the non-root tests run as."""

    __test__ = False  # not a test class, whatever its name
    name: str
    uid: int
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for the user: nothing of root's (XDG_RUNTIME_DIR, DOCKER_HOST...)."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "LANG": "C.UTF-8",
            "KERNELBRIDGE_LABELS": os.environ["KERNELBRIDGE_LABELS"],
            **extra,
        }

    def argv(self, *command: str, **env: str) -> list[str]:
        """``command`` run as the user, in :meth:`env`."""
        assigns = [f"{key}={value}" for key, value in self.env(**env).items()]
        return ["runuser", "-u", self.name, "--", "env", "-i", *assigns, *command]


def has_subids(path: Path, user: str) -> bool:
    try:
        return any(line.split(":")[0] == user for line in path.read_text().splitlines())
    except OSError:
        return False
