"""The CLI backend: ``podman`` / ``docker`` driven through their command line (the fallback).

``backend`` (containers: one client process per attached sandbox), ``images`` (the same CLI's
image store), ``command`` (one bounded CLI call and the stderr markers it is read by),
``stream`` (a ContainerStream over a child process's stdio), ``podman`` (facts about the local
podman: cgroups, the OCI runtime to force, the rootless storage driver).
"""

from kernelbridge.runtime.cli.backend import CliRuntime, container_flags, parse_ps_output
from kernelbridge.runtime.cli.images import CliImages

__all__ = ["CliImages", "CliRuntime", "container_flags", "parse_ps_output"]
