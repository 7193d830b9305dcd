"""Container runtimes behind one small seam (:mod:`kernelbridge.runtime.base`).

Everything a caller above this package needs is importable from here; the test double (a local
process per "container") is :mod:`kernelbridge.testing`'s. Design: docs/design/runtime.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.runtime.base import (
        HOST_LABEL,
        OWNER_LABEL,
        SESSION_LABEL,
        ContainerInfo,
        ContainerSpec,
        ContainerState,
        ContainerStream,
        ImageInfo,
        ImageStore,
        RuntimeBackend,
        RuntimeInfo,
    )
    from kernelbridge.runtime.cli.backend import CliRuntime
    from kernelbridge.runtime.cli.podman import (
        VFS_WARNING,
        cgroup_layout,
        rootless_storage_conf,
        use_overlay_storage,
    )
    from kernelbridge.runtime.reaper import pid_alive, reap_orphans
    from kernelbridge.runtime.select import (
        Selection,
        cli_runtime,
        open_runtime,
        open_selection,
        select_runtime,
    )
    from kernelbridge.runtime.unavailable import UnavailableRuntime

__all__ = [
    "HOST_LABEL",
    "OWNER_LABEL",
    "SESSION_LABEL",
    "VFS_WARNING",
    "CliRuntime",
    "ContainerInfo",
    "ContainerSpec",
    "ContainerState",
    "ContainerStream",
    "ImageInfo",
    "ImageStore",
    "RuntimeBackend",
    "RuntimeInfo",
    "Selection",
    "UnavailableRuntime",
    "cgroup_layout",
    "cli_runtime",
    "open_runtime",
    "open_selection",
    "pid_alive",
    "reap_orphans",
    "rootless_storage_conf",
    "select_runtime",
    "use_overlay_storage",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
