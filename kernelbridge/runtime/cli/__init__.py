"""The CLI backend: ``podman`` / ``docker`` driven through their command line (the fallback).

``backend`` (containers: one client process per attached sandbox), ``images`` (the same CLI's
image store), ``command`` (one bounded CLI call and the stderr markers it is read by),
``stream`` (a ContainerStream over a child process's stdio), ``podman`` (facts about the local
podman: cgroups, the OCI runtime to force, the rootless storage driver).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.runtime.cli.backend import CliRuntime, container_flags, parse_ps_output
    from kernelbridge.runtime.cli.images import CliImages

__all__ = ["CliImages", "CliRuntime", "container_flags", "parse_ps_output"]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
