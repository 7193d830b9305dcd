"""Which runtime serves this bridge, and why: the only place that branches on runtime names.

``KERNELBRIDGE_RUNTIME`` unset: the first engine API that answers (``CONTAINER_HOST``, ``DOCKER_HOST``,
podman's system socket, a podman service of our own, docker's socket), else the podman CLI, else the
docker CLI; ``podman`` / ``docker``: that engine's API, else its CLI; ``podman-api`` / ``docker-api``:
the API only; ``podman-cli`` / ``docker-cli``: the CLI only; ``kube``: pods, no fallback.
``KERNELBRIDGE_ENGINES`` (URLs) puts several engines behind one backend. The reason is one line
(:func:`open_selection`, for ``doctor``). Engine modules are imported only when an engine is tried.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError, RuntimeUnavailable
from kernelbridge.runtime.base import RuntimeBackend
from kernelbridge.runtime.cli.backend import CliRuntime
from kernelbridge.runtime.cli.podman import default_oci_runtime
from kernelbridge.runtime.engine.endpoint import Engine
from kernelbridge.runtime.info_store import InfoStore


@dataclass(frozen=True, slots=True)
class Selection:
    """The runtime picked for this bridge, and why (one line, printed by ``doctor``)."""

    backend: RuntimeBackend
    reason: str


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[RuntimeBackend]:
    """The runtime backend for ``settings``, open for the duration of the block.

    Raises RuntimeUnavailable when no runtime can be used, ConfigError on contradicting settings.
    """
    async with open_selection(settings) as selection:
        yield selection.backend


@contextlib.asynccontextmanager
async def open_selection(settings: Settings) -> AsyncIterator[Selection]:
    """Like :func:`open_runtime`, with the reason the backend was picked. The backend (and any
    engine service or ssh forward it started) is closed on exit."""
    selection = await select_runtime(settings)
    async with contextlib.AsyncExitStack() as stack:
        backend = selection.backend
        if isinstance(backend, contextlib.AbstractAsyncContextManager):
            # Backends that own a task group (the CLI's) must be entered; closing is their exit.
            await stack.enter_async_context(backend)
        else:
            stack.push_async_callback(_close, selection.backend)
        yield selection


async def _close(backend: RuntimeBackend) -> None:
    with anyio.CancelScope(shield=True):
        await backend.aclose()


def _split(runtime: str | None) -> tuple[list[Engine], str]:
    """``KERNELBRIDGE_RUNTIME`` -> engines to try in order, and ``api`` | ``cli`` | ``auto``."""
    if not runtime:
        return ["podman", "docker"], "auto"
    engine, _, mode = runtime.partition("-")
    if engine == "kube":  # no CLI to fall back on; the callers that want one get podman's
        return ["podman", "docker"], "auto"
    match engine:
        case "podman" | "docker":
            return [engine], mode or "auto"
    raise ConfigError(f"unknown runtime {runtime!r}: expected podman or docker")  # load_settings said so


async def select_runtime(settings: Settings) -> Selection:
    """Pick and open the runtime (see the module docstring); the caller closes (or enters and
    exits) ``backend``. Prefer :func:`open_runtime`."""
    from kernelbridge.runtime.engine import connect

    if settings.runtime == "kube":
        return await _kube(settings)
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
            found, reasons = await connect.connect_system_socket(engine, settings)
            if found is not None:
                return Selection(found, f"{found.engine} API at {found.endpoint.url}")
            tried += reasons
            if engine == "podman" and es.start_service and shutil.which("podman"):
                try:
                    own = await connect.start_own_podman(settings)
                except RuntimeUnavailable as exc:
                    tried.append(str(exc))
                else:
                    return Selection(own, f"podman API at {own.endpoint.url} (started by kernelbridge)")
        if mode == "api":
            raise RuntimeUnavailable(f"no {' or '.join(engines)} engine answers: {'; '.join(tried)}")
    why = "no engine socket answered" if tried else f"KERNELBRIDGE_RUNTIME={settings.runtime}"
    for engine in engines:
        backend = _cli_backend(engine, settings)
        if backend is not None:
            return Selection(backend, f"{engine} CLI: {why}")
    raise RuntimeUnavailable(
        f"no container runtime found ({' or '.join(engines)} not on PATH and no engine answers); "
        "install podman (apt-get install podman runc) or run `make setup` as root"
    )


async def _kube(settings: Settings) -> Selection:
    try:
        from kernelbridge.runtime.kube import open_kube
    except ImportError as exc:  # the `kube` extra is not installed
        raise RuntimeUnavailable(
            f"KERNELBRIDGE_RUNTIME=kube needs the kube extra ({exc.name} is missing): "
            "pip install 'kernelbridge-mcp[kube]'"
        ) from None
    runtime = await open_kube(settings)
    where = f"{runtime.endpoint} ({runtime.conn.source})"
    return Selection(runtime, f"Kubernetes {runtime.version} at {where}, namespace {settings.kube.namespace}")


async def _engine_set(settings: Settings, wanted: list[Engine]) -> Selection:
    from kernelbridge.runtime.engine import connect
    from kernelbridge.runtime.engine.placement import EngineSet

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


def _cli_backend(engine: Engine, settings: Settings) -> CliRuntime | None:
    """The CLI backend of ``engine`` when its executable is installed (not yet entered)."""
    path = shutil.which(engine)
    if not path:
        return None
    if engine == "podman":
        oci_runtime = default_oci_runtime()
        # This machine's podman keeps its info for this user's other processes, unless these
        # variables make the CLI a client of a remote service. docker's daemon keeps none: its
        # configuration and restarts are not in files the key could stamp, and it answers fast.
        remote = any(os.environ.get(v) for v in ("CONTAINER_HOST", "CONTAINER_CONNECTION"))
        kept = None if remote else InfoStore(where="cli", oci_runtime=oci_runtime, executable=path)
        return CliRuntime("podman", path, oci_runtime=oci_runtime, workdir=settings.run_dir, info_store=kept)
    return CliRuntime("docker", path, workdir=settings.run_dir)


def cli_runtime(settings: Settings) -> CliRuntime:
    """The CLI backend of the configured engine, else podman when installed, else docker
    (for callers that need the CLI whatever the settings, e.g. the test suite's leftover check).

    Raises RuntimeUnavailable when neither is installed.
    """
    engines, _ = _split(settings.runtime)
    for engine in engines:
        backend = _cli_backend(engine, settings)
        if backend is not None:
            return backend
    raise RuntimeUnavailable(
        f"no container runtime found ({' or '.join(engines)} not on PATH); "
        "install podman (apt-get install podman runc) or run `make setup` as root"
    )
