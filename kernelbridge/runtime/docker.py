"""docker: supported where a Docker engine runs (none does on the development machines)."""

from __future__ import annotations

from dataclasses import dataclass

from kernelbridge.runtime.oci import OciCliRuntime


@dataclass
class DockerRuntime(OciCliRuntime):
    name: str = "docker"
    executable: str = "docker"

    def extra_flags(self) -> list[str]:
        # Nothing reads docker's log of a sandbox: the tunnel is the only consumer of its stdio.
        return ["--log-driver", "none"]
