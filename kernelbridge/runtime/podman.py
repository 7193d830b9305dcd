"""podman: the default runtime."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kernelbridge.runtime.oci import OciCliRuntime


@dataclass
class PodmanRuntime(OciCliRuntime):
    name: str = "podman"
    executable: str = "podman"
    oci_runtime: str | None = field(default=None)
    """``--runtime`` to force (e.g. ``runc``), or None for podman's default."""

    def extra_flags(self) -> list[str]:
        # passthrough hands the container's stdio straight to us: measured fastest, and the
        # default k8s-file driver would also write every output of the kernel to disk.
        flags = ["--log-driver", "passthrough"]
        if self.oci_runtime:
            flags += ["--runtime", self.oci_runtime]
        return flags

    def remove_flags(self) -> list[str]:
        # Without --ignore, podman stops at the first name that is already gone and leaves the
        # rest; `-t 0` kills at once instead of waiting out the stop timeout.
        return ["--ignore", "--time", "0"]


def cgroup_layout() -> str:
    """``v2`` (unified), ``hybrid`` (v1 controllers plus a unified hierarchy) or ``v1``."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "unified").is_dir():
        return "hybrid"
    return "v1"


def default_oci_runtime() -> str | None:
    """crun fails to create containers on hybrid cgroup hierarchies; use runc there.

    Returns ``runc`` when crun is installed (so podman may pick it), the layout is hybrid and
    runc exists; forcing runc where podman would have picked it anyway is harmless. Decided
    from files alone: asking ``podman info`` costs ~0.4 s on every sandbox start.
    """
    if cgroup_layout() == "hybrid" and shutil.which("crun") and shutil.which("runc"):
        return "runc"
    return None
