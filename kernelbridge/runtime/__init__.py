"""Container runtimes: which one runs sandboxes here, and why.

:func:`open_runtime` is the one place that decides, from the settings, between the engine API
(``engine.EngineRuntime``: dockerd or ``podman system service``, local or remote, or several
engines with least-loaded placement) and the command line (``cli.CliRuntime``, the fallback),
and records the reason in one line for ``doctor``. ``KERNELBRIDGE_RUNTIME``:

==============  ==================================================================================
(unset)         an engine API that answers: ``CONTAINER_HOST``, ``DOCKER_HOST``, podman's system
                socket, a podman service of our own, docker's socket; else the podman CLI, else
                the docker CLI
``podman``      podman: its API (``CONTAINER_HOST``, its system socket, or a service of our own),
                else its CLI
``docker``      docker: its API (``DOCKER_HOST`` or ``/var/run/docker.sock``), else its CLI
``podman-api``  podman's API only; ``docker-api`` likewise (an error when no engine answers)
``podman-cli``  the podman command line only; ``docker-cli`` likewise
==============  ==================================================================================

``KERNELBRIDGE_ENGINES`` (URLs) puts several engines behind one backend
(``engine_placement.EngineSet``). ``detect_runtime`` (the CLI runtimes of ``oci.py``) stays for
the callers that have not moved to the stream seam yet.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError, RuntimeUnavailable
from kernelbridge.runtime.base import (
    OWNER_LABEL,
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.docker import DockerRuntime
from kernelbridge.runtime.engine_endpoint import Engine
from kernelbridge.runtime.oci import OciCliRuntime
from kernelbridge.runtime.podman import PodmanRuntime, cgroup_layout, default_oci_runtime

__all__ = [
    "OWNER_LABEL",
    "SESSION_LABEL",
    "ContainerInfo",
    "ContainerSpec",
    "ContainerState",
    "ContainerStream",
    "DockerRuntime",
    "OciCliRuntime",
    "PodmanRuntime",
    "RuntimeBackend",
    "RuntimeInfo",
    "Selection",
    "cgroup_layout",
    "detect_runtime",
    "open_runtime",
    "pid_alive",
    "reap_orphans",
    "select_runtime",
]


@dataclass(frozen=True, slots=True)
class Selection:
    """The runtime picked for this bridge, and why (one line, printed by ``doctor``)."""

    backend: RuntimeBackend
    reason: str


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Selection]:
    """``async with open_runtime(settings) as selected``: ``selected.backend`` runs sandboxes,
    ``selected.reason`` says why it was picked; the backend (and any engine service or ssh
    forward it started) is closed on exit.

    Raises RuntimeUnavailable when nothing can run sandboxes, ConfigError on contradicting settings.
    """
    selection = await select_runtime(settings)
    try:
        yield selection
    finally:
        with anyio.CancelScope(shield=True):
            await selection.backend.aclose()


def _split(runtime: str | None) -> tuple[list[Engine], str]:
    """``KERNELBRIDGE_RUNTIME`` -> engines to try in order, and ``api`` | ``cli`` | ``auto``."""
    if not runtime:
        return ["podman", "docker"], "auto"
    engine, _, mode = runtime.partition("-")
    return [engine], mode or "auto"  # type: ignore[list-item]


async def select_runtime(settings: Settings) -> Selection:
    """Pick and open the runtime (see the module docstring). The caller closes ``backend``."""
    from kernelbridge.runtime import engine_connect as connect

    engines, mode = _split(settings.runtime)
    es = settings.engine
    if es.urls:
        if mode == "cli":
            raise ConfigError(
                f"KERNELBRIDGE_ENGINES needs the engine API, not KERNELBRIDGE_RUNTIME={settings.runtime}"
            )
        return await _engine_set(settings, engines if settings.runtime else [])
    tried: list[str] = []
    if mode in ("api", "auto"):
        explicit = {"podman": es.container_host, "docker": es.docker_host}
        for engine in engines:
            url = explicit[engine]
            if url:
                # The user pointed us there: a failure is theirs to see, not a reason to fall back.
                variable = "CONTAINER_HOST" if engine == "podman" else "DOCKER_HOST"
                runtime = await connect.connect_engine(url, settings, engine=engine)
                return Selection(runtime, f"{runtime.engine} API at {runtime.endpoint.url} ({variable})")
        for engine in engines:
            runtime, reasons = await connect.connect_system_socket(engine, settings)
            if runtime is not None:
                return Selection(runtime, f"{runtime.engine} API at {runtime.endpoint.url}")
            tried += reasons
            if engine == "podman" and shutil.which("podman"):
                try:
                    runtime = await connect.start_own_podman(settings)
                except RuntimeUnavailable as exc:
                    tried.append(str(exc))
                else:
                    why = f"podman API at {runtime.endpoint.url} (started by kernelbridge)"
                    return Selection(runtime, why)
        if mode == "api":
            raise RuntimeUnavailable(f"no {' or '.join(engines)} engine answers: {'; '.join(tried)}")
    why = "no engine socket answered" if tried else "chosen by KERNELBRIDGE_RUNTIME"
    for engine in engines:
        backend = _cli_backend(engine)
        if backend is not None:
            return Selection(backend, f"{engine} CLI: {why}")
    raise RuntimeUnavailable(
        f"no container runtime found ({' or '.join(engines)} not on PATH and no engine answers); "
        "install podman (apt-get install podman runc) or run `make setup` as root"
    )


async def _engine_set(settings: Settings, wanted: list[Engine]) -> Selection:
    from kernelbridge.runtime import engine_connect as connect
    from kernelbridge.runtime.engine_placement import EngineSet

    opened: list[Any] = []
    try:
        for url in settings.engine.urls:
            opened.append(await connect.connect_engine(url, settings, engine=wanted[0] if wanted else None))
            if wanted and opened[-1].engine not in wanted:
                raise ConfigError(
                    f"{url} is a {opened[-1].engine} engine, not {wanted[0]} (KERNELBRIDGE_RUNTIME)"
                )
    except BaseException:
        with anyio.CancelScope(shield=True):
            for runtime in opened:
                await runtime.aclose()
        raise
    urls = ", ".join(r.endpoint.url for r in opened)
    return Selection(EngineSet(opened), f"{len(opened)} engines, least-loaded placement: {urls}")


def _cli_backend(engine: Engine) -> RuntimeBackend | None:
    """The lead's CLI backend over the stream seam, when ``engine``'s executable is installed."""
    executable = shutil.which(engine)
    if executable is None:
        return None
    try:
        from kernelbridge.runtime.cli import CliRuntime  # type: ignore[import-not-found]
    except ImportError:
        return None
    return CliRuntime(engine=engine)  # type: ignore[no-any-return]


def detect_runtime(settings: Settings) -> OciCliRuntime:
    """The configured runtime's CLI, else podman when installed, else docker (the old seam).

    Raises RuntimeUnavailable when none is installed.
    """
    wanted = [settings.runtime.partition("-")[0]] if settings.runtime else ["podman", "docker"]
    for name in wanted:
        path = shutil.which(name)
        if not path:
            continue
        if name == "podman":
            return PodmanRuntime(executable=path, oci_runtime=default_oci_runtime())
        return DockerRuntime(executable=path)
    raise RuntimeUnavailable(
        f"no container runtime found ({' or '.join(wanted)} not on PATH); "
        "install podman (apt-get install podman runc) or run `make setup` as root"
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap_orphans(settings: Settings, runtime: OciCliRuntime | None = None) -> int:
    """Remove sandbox containers whose owning bridge process is gone (e.g. it was SIGKILLed).

    Returns how many were removed. Containers of live bridges are left alone.
    """
    runtime = runtime or detect_runtime(settings)
    orphans = [
        c.name
        for c in await runtime.list_containers({SESSION_LABEL: ""})
        if c.owner_pid is None or not pid_alive(c.owner_pid)
    ]
    await runtime.remove(orphans)
    return len(orphans)
