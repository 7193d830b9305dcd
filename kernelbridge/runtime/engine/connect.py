"""Opening an engine: a URL (with its ssh forward if any), a system socket, or our own podman service.

Each function returns a ready :class:`EngineRuntime` (the engine answered ``GET /version``) that
owns whatever helper process it needed, or raises RuntimeUnavailable / ConfigError with one line.
Which of them to try, and in what order, is the selection's business (``runtime/__init__.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.cli.podman import default_oci_runtime
from kernelbridge.runtime.engine.api import EngineRuntime, open_engine
from kernelbridge.runtime.engine.endpoint import (
    Endpoint,
    Engine,
    default_remote_socket,
    parse_endpoint,
    system_sockets,
)
from kernelbridge.runtime.engine.service import HelperProcess, podman_service, ssh_forward
from kernelbridge.runtime.engine.transport import API_TIMEOUT, EngineClient
from kernelbridge.runtime.info_store import InfoStore

PROBE_TIMEOUT = 3.0
"""Bound of asking a candidate socket whether an engine answers: a local engine answers in
milliseconds; one that does not within this is not worth picking for every sandbox of a session."""
HINTS = {
    "docker": "is dockerd running?",
    "podman": "is `podman system service` running?",
}


def _client(endpoint: Endpoint, engine: Engine | None, unix_path: str | None = None) -> EngineClient:
    return EngineClient(
        endpoint, engine=engine or "container", hint=HINTS.get(engine or "", ""), unix_path=unix_path
    )


async def connect_engine(
    url: str, settings: Settings, *, engine: Engine | None = None, note: str = "", probe: bool = False
) -> EngineRuntime:
    """The engine at ``url`` (``unix://``, ``tcp://``, ``https://``, ``ssh://``).

    ``engine`` is a hint for messages and for the remote socket of an ``ssh://`` URL that names
    none; the engine itself says which it is. ``probe`` bounds the first answer by
    :data:`PROBE_TIMEOUT` instead of the usual call bound.
    """
    endpoint = parse_endpoint(url, settings.engine)
    helpers: list[HelperProcess] = []
    unix_path = None
    if endpoint.scheme == "ssh":
        ssh = settings.engine.ssh_command
        if shutil.which(ssh[0]) is None:
            raise RuntimeUnavailable(f"cannot reach {endpoint.url}: {ssh[0]} is not installed")
        remote = default_remote_socket(engine, endpoint)
        helper, local = ssh_forward(endpoint, remote, settings.run_dir, ssh)
        await _start_until_it_answers(helper, local, engine)
        helpers.append(helper)
        unix_path = str(local)
    client = _client(endpoint, engine, unix_path)
    client.timeout = PROBE_TIMEOUT if probe else API_TIMEOUT
    # A socket on this host: its podman's info may be kept for this user's other processes.
    kept = InfoStore(where=f"socket:{endpoint.path}") if endpoint.scheme == "unix" else None
    runtime = await open_engine(client, helpers=helpers, note=note, info_store=kept)
    client.timeout = API_TIMEOUT
    return runtime


async def connect_system_socket(engine: Engine, settings: Settings) -> tuple[EngineRuntime | None, list[str]]:
    """The first of ``engine``'s default sockets that answers; else None and why each did not."""
    reasons: list[str] = []
    for path in system_sockets(engine):
        try:
            return await connect_engine(f"unix://{path}", settings, engine=engine, probe=True), reasons
        except RuntimeUnavailable as exc:
            reasons.append(str(exc))
    return None, reasons


async def start_own_podman(settings: Settings) -> EngineRuntime:
    """A ``podman system service`` of this bridge (stopped when the runtime is closed)."""
    podman = shutil.which("podman")
    if podman is None:
        raise RuntimeUnavailable("podman is not installed")
    oci_runtime = default_oci_runtime()
    helper, sock = podman_service(settings.run_dir, oci_runtime, podman)
    await _start_until_it_answers(helper, sock, "podman")
    endpoint = Endpoint("unix", path=str(sock))
    # Its socket is a new one each time: its info is kept as that of this podman executable's.
    kept = InfoStore(where="service", oci_runtime=oci_runtime, executable=podman)
    return await open_engine(
        _client(endpoint, "podman"), helpers=[helper], note="started by kernelbridge", info_store=kept
    )


async def _start_until_it_answers(helper: HelperProcess, sock: Path, engine: Engine | None) -> None:
    """Start ``helper`` (an ssh forward, a podman service) and wait until the engine answers a
    ping on the local socket ``sock`` it provides."""
    ping = _client(Endpoint("unix", path=str(sock)), engine)

    async def ready() -> bool:
        if not await anyio.Path(sock).exists():
            return False
        try:
            await ping.request("GET", "/_ping", timeout=PROBE_TIMEOUT)
        except RuntimeUnavailable:
            return False
        return True

    try:
        await helper.start(ready)
    finally:
        await ping.aclose()
