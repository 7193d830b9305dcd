"""podman: the default runtime."""

from __future__ import annotations

import shutil
import subprocess
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


def cgroup_layout() -> str:
    """``v2`` (unified), ``hybrid`` (v1 controllers plus a unified hierarchy) or ``v1``."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "unified").is_dir():
        return "hybrid"
    return "v1"


def default_oci_runtime(executable: str) -> str | None:
    """crun fails to create containers on hybrid cgroup hierarchies; use runc there.

    Returns ``runc`` only when podman's default is crun, the layout is hybrid and runc exists.
    """
    if cgroup_layout() != "hybrid" or not shutil.which("runc"):
        return None
    try:
        current = subprocess.run(
            [executable, "info", "--format", "{{.Host.OCIRuntime.Name}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return "runc" if current == "crun" else None
