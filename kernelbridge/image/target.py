"""The sandbox's Python platform: what pip picks wheels for, wherever it runs.

The image's interpreter is Debian bookworm's ``python3`` (CPython 3.11, glibc 2.36, x86_64), not
whatever Python runs the host's pip, so every pip run that fetches something for the sandbox (the
image build, ``%pip install`` through the host) names this platform explicitly and takes binary
wheels only: with ``--only-binary=:all:`` pip never builds a source distribution, so nothing of a
package runs on the host. The one place that says what the sandbox is.

Why every manylinux tag is listed: pip 23 does not widen ``--platform manylinux_2_36_x86_64`` to
the older glibc versions it implies (measured: scikit-learn's ``manylinux_2_27`` wheel was "not
found"), so the tags from glibc 2.36 down to manylinux1 are given one by one. No I/O.
"""

from __future__ import annotations

PYTHON_VERSION = "3.11"
IMPLEMENTATION = "cp"
ABI = "cp311"
ARCH = "x86_64"
GLIBC_MINOR = 36
"""Debian bookworm's glibc is 2.36: a ``manylinux_2_X`` wheel runs in the sandbox for X <= 36."""
LEGACY_MANYLINUX = ("manylinux2014", "manylinux2010", "manylinux1")
"""The PEP 513/571/599 names of glibc 2.17, 2.12 and 2.5, which older projects still publish."""
DESCRIPTION = f"CPython {PYTHON_VERSION} on manylinux {ARCH}"
"""How messages name the sandbox's platform."""
ENVIRONMENT = {
    "implementation_name": "cpython",
    "platform_machine": ARCH,
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "platform_python_implementation": "CPython",
    "python_version": PYTHON_VERSION,
    "python_full_version": f"{PYTHON_VERSION}.2",
    "implementation_version": f"{PYTHON_VERSION}.2",
}
"""PEP 508 marker values of the sandbox's interpreter (``requests; sys_platform == "linux"``)."""


def platforms() -> tuple[str, ...]:
    """Every platform tag of a wheel the sandbox can load, newest first."""
    tags = [f"manylinux_2_{minor}_{ARCH}" for minor in range(GLIBC_MINOR, 4, -1)]
    return (*tags, *(f"{name}_{ARCH}" for name in LEGACY_MANYLINUX))


PIP_TARGET_FLAGS = (
    "--only-binary=:all:",
    *(f"--platform={tag}" for tag in platforms()),
    f"--implementation={IMPLEMENTATION}",
    f"--python-version={PYTHON_VERSION}",
    f"--abi={ABI}",
)
"""The pip flags that pick wheels for the sandbox (binary wheels only: nothing is ever built)."""
