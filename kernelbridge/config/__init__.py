"""Settings: read once from ``KERNELBRIDGE_*`` environment variables into frozen dataclasses.

Every setting has a ``KERNELBRIDGE_<NAME>`` variable; the stateless predecessor's
``MCP_BRIDGE_<NAME>`` is accepted as a fallback so existing client configs keep working.
A bad value raises :class:`ConfigError` naming the variable, the value and what is expected.

The package (it outgrew one module): ``env`` reads one variable at a time, ``mounts`` checks the
host directories a sandbox may see, ``packages`` holds ``%pip install``'s settings; this module
holds the settings records, :func:`load_settings` and the state directory's layout.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernelbridge.config import env as _env
from kernelbridge.config.mounts import (
    PACKAGES_DIR,
    RESERVED_TARGETS,
    Mount,
    check_mount,
    check_mount_set,
    check_source,
    parse_mounts,
)
from kernelbridge.config.packages import PackageSettings, parse_policy, tmpfs_size
from kernelbridge.errors import ConfigError

__all__ = [
    "CLIENTS",
    "HTTP_DIR",
    "PACKAGES_DIR",
    "RESERVED_TARGETS",
    "RUNTIMES",
    "ConfigError",
    "EngineSettings",
    "HttpSettings",
    "Mount",
    "PackageSettings",
    "SandboxLimits",
    "Settings",
    "check_mount",
    "check_mount_set",
    "check_source",
    "check_state_dir",
    "default_state_dir",
    "load_settings",
    "namespace_names",
    "namespace_state_dir",
    "parse_mounts",
]

HTTP_DIR = "http"
"""HTTP tokens' namespaces keep their state in ``<state dir>/http/<namespace>/``."""
_NAMESPACE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")

CLIENTS = ("claude-code", "claude-desktop", "cursor", "vscode")
"""The MCP clients whose config files the hub reads (``KERNELBRIDGE_CLIENT_CONFIGS``; see
:mod:`kernelbridge.hub.sources` for where each keeps its servers)."""

RUNTIMES = ("podman", "docker", "podman-api", "docker-api", "podman-cli", "docker-cli")
"""Values of ``KERNELBRIDGE_RUNTIME``: an engine (its API when one answers, else its CLI), or an
engine and a way to drive it, with no fallback."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits and hardening of one sandbox container (see DESIGN.md)."""

    memory: str = "512m"
    """Memory limit; swap is limited to the same value so the kernel cannot page out."""
    pids: int = 128
    """Maximum processes+threads in the container: stops fork bombs."""
    cpus: float = 1.0
    tmp_size: str = "64m"
    """Size of the /tmp tmpfs. Unsized, podman's /tmp is a huge tmpfs counted against memory."""
    workspace_size: str = "256m"
    packages_size: str = "192m"
    """Size of the /packages tmpfs where the session's ``%pip install``s go: the bytes that may be
    installed (``PackageSettings.max_bytes``) and half as much again for the wheel being unpacked
    (``config.packages.tmpfs_size``). Like every tmpfs it counts against ``memory``."""
    nofile: int = 1024
    nproc: int = 4096
    """RLIMIT_NPROC is per host uid, shared by every container running as 65534: keep it high
    and let ``pids`` bound each container."""
    user: str = "65534:65534"
    network: str = "none"
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Where the container engine API is (see ``kernelbridge.runtime``): read from the variables the
    docker and podman clients read, so an engine configured for them is found the same way."""

    urls: tuple[str, ...] = ()
    """``KERNELBRIDGE_ENGINES``: several engines (``unix://``, ``tcp://``, ``ssh://`` URLs, separated
    by commas or spaces); each new sandbox goes to the one running the fewest sandboxes."""
    docker_host: str | None = None
    """``DOCKER_HOST``: a docker engine (or a podman service speaking its API)."""
    container_host: str | None = None
    """``CONTAINER_HOST``: a podman service."""
    tls_verify: bool = False
    """``DOCKER_TLS_VERIFY``: talk TLS to ``tcp://`` engines, verify the engine against
    ``ca.pem`` and present ``cert.pem``/``key.pem`` from ``cert_path``."""
    tls: bool = False
    """``DOCKER_TLS``: TLS without verifying the engine's certificate (as docker's ``--tls``)."""
    cert_path: Path | None = None
    """``DOCKER_CERT_PATH`` (default ``~/.docker``)."""
    ssh_command: tuple[str, ...] = ("ssh",)
    """``KERNELBRIDGE_SSH_COMMAND``: the ssh client and options for ``ssh://`` engines (e.g.
    ``ssh -i ~/.ssh/engine_key``), split like a shell would; plain ``ssh`` reads ~/.ssh/config."""
    start_service: bool = True
    """Whether, when no engine answers, podman's API may be served by a ``podman system service``
    of our own. A bridge amortizes one over all its sandboxes; the tunnel process of a single
    plain-Jupyter kernel does not (it falls back to the CLI instead)."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """``kernelbridge serve --http``: who may connect and how much each token may use."""

    tokens: tuple[str, ...] = field(default=(), repr=False)
    """``KERNELBRIDGE_HTTP_TOKENS``: comma-separated bearer tokens, each ``name:token`` or a bare
    token (parsed by :mod:`kernelbridge.server.http`; never shown in a repr)."""
    tokens_file: Path | None = None
    """``KERNELBRIDGE_HTTP_TOKENS_FILE``: one token per line, same forms. With neither, a token is
    generated at the first start and kept in ``<state dir>/http-token`` (mode 0600)."""
    allowed_hosts: tuple[str, ...] = ()
    """``KERNELBRIDGE_HTTP_ALLOWED_HOSTS``: Host header values accepted (``name``, ``name:port`` or
    ``name:*``); loopback names by default. Required for a non-loopback bind."""
    max_sessions: int = 4
    """``KERNELBRIDGE_HTTP_MAX_SESSIONS``: sessions one token may hold at once (the bridge's
    ``KERNELBRIDGE_MAX_SESSIONS`` still bounds them all together)."""
    max_calls: int = 4
    """``KERNELBRIDGE_HTTP_MAX_CALLS``: ``run_python`` calls of one token in flight at once."""
    disk_quota: int = 2 * 1024**3
    """``KERNELBRIDGE_HTTP_DISK_QUOTA``: bytes one token's files may take on the host (journals of
    all its sessions, old and live, exports, saved tools). Past it new sessions are not journalled
    and exports are refused: one token cannot fill the disk the others journal to."""


@dataclass(frozen=True, slots=True)
class Settings:
    """All kernelbridge settings. Build with :func:`load_settings`."""

    state_dir: Path
    runtime: str | None = None
    """One of :data:`RUNTIMES`; None picks an engine API that answers (podman's, then docker's),
    else the podman CLI, else the docker CLI."""
    image: str | None = None
    """Sandbox image reference; None means the locally built image of this version."""
    max_sessions: int = 8
    idle_timeout: float = 1800.0
    """Seconds after which an unused session's sandbox is closed; also how long a sandbox whose
    bridge has gone waits for another to adopt it before it ends itself."""
    durable: bool = True
    """``KERNELBRIDGE_DURABLE``: sessions outlive their bridge (a client restart, a crash, an
    upgrade): the sandbox runs on detached and the next bridge on this state directory adopts
    it. 0: sessions end with their bridge (no sandbox is left behind)."""
    auto_restore: bool = False
    """``KERNELBRIDGE_AUTO_RESTORE``: a session whose sandbox was lost (the machine restarted) is
    rebuilt from its journal by its next call, host tool calls answered from the recording, before
    that call's code runs; off: the call says so and offers ``restore=``."""
    detached_buffer: int = 32 * 1024 * 1024
    """``KERNELBRIDGE_DETACHED_BUFFER``: bytes of kernel output a detached sandbox holds for its
    next bridge (in the sandbox's own memory); past it the oldest output is dropped, counted."""
    warm_pool: int = 1
    """Pre-started sandboxes kept ready so a new session's first call skips the cold start."""
    default_timeout: float = 30.0
    max_timeout: float = 600.0
    output_limit: int = 20_000
    """Characters of output returned to the model per call (head and tail are kept)."""
    servers_config: tuple[Path, ...] = ()
    allow_servers: tuple[str, ...] = ()
    """``KERNELBRIDGE_ALLOW_SERVERS``: comma-separated host MCP server names (fnmatch wildcards
    allowed); when set, only matching servers can be granted or seen by sandboxed code.
    Empty: every configured server is allowed."""
    deny_servers: tuple[str, ...] = ()
    """``KERNELBRIDGE_DENY_SERVERS``: comma-separated server names or patterns hidden from
    sandboxed code and refused as grants; wins over ``allow_servers``."""
    deny_tools: tuple[str, ...] = ()
    """``KERNELBRIDGE_DENY_TOOLS``: comma-separated ``server.tool`` patterns (fnmatch wildcards,
    matched against the real names, e.g. ``github.delete_*`` or ``*.shell``). A denied tool is absent
    from every tool list and its calls answer ``denied``."""
    approve_tools: tuple[str, ...] = ()
    """``KERNELBRIDGE_APPROVE_TOOLS``: comma-separated ``server.tool`` patterns (as ``deny_tools``;
    ``*`` alone means every tool). A matching call from sandboxed code waits for a person's answer,
    asked through MCP elicitation of the client whose ``run_python`` runs the cell."""
    client_configs: tuple[str, ...] = CLIENTS
    """``KERNELBRIDGE_CLIENT_CONFIGS``: whose config files are searched for host servers: ``all``
    (default), ``none``, or some of :data:`CLIENTS` (comma-separated)."""
    project: Path | None = None
    """``KERNELBRIDGE_PROJECT`` (or ``--project``): a project directory whose MCP files (``.mcp.json``,
    ``.cursor/mcp.json``, ``.vscode/mcp.json``, Claude Code's local scope) are read too. Unset: none
    is, since a project directory is not trusted by default."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    kernel_start_timeout: float = 60.0
    image_budget: int = 50_000
    """``KERNELBRIDGE_IMAGE_BUDGET``: base64 characters of one image sent to the model; a bigger
    image arrives downscaled, its original kept as a resource (see ``server/images.py``)."""
    journal_budget: int = 64 * 1024 * 1024
    """``KERNELBRIDGE_JOURNAL_BUDGET``: bytes one session's journal may hold (``64m``, ``1g`` or a
    number of bytes). Past it the journal gets one ``truncated`` line and nothing more, so no
    sandbox can fill the host's disk; the default keeps every journal restorable and replayable
    (``kernelbridge replay`` reads notebooks of up to 64 MiB)."""
    history_budget: int = 1024**3
    """``KERNELBRIDGE_HISTORY_BUDGET``: bytes the old generations of sessions (journals and records
    of sessions no longer live) may take in the state directory. Nothing is removed on its own:
    past it the bridge says so when it starts, and ``kernelbridge prune`` removes the oldest."""
    export_dir: Path | None = None
    """``KERNELBRIDGE_EXPORT_DIR``: where ``export_notebook(path=...)`` may write (default
    ``<state_dir>/exports``); a model's export never leaves this directory."""
    labels: tuple[tuple[str, str], ...] = ()
    """``KERNELBRIDGE_LABELS``: extra ``key=value`` labels (comma-separated) on every sandbox
    container, e.g. to tell an operator's bridges apart on a shared engine."""
    engine: EngineSettings = field(default_factory=EngineSettings)
    image_packages: tuple[str, ...] = ()
    """``KERNELBRIDGE_IMAGE_PACKAGES``: comma-separated Python packages added to the sandbox image
    (``kernelbridge image build`` installs them; the image's name covers them)."""
    image_requirements: Path | None = None
    """``KERNELBRIDGE_IMAGE_REQUIREMENTS``: a requirements file of more packages for the image."""
    allow_unlimited: bool = False
    """``KERNELBRIDGE_ALLOW_UNLIMITED=1``: start sandboxes even where the runtime ignores the memory
    and pid limits (rootless podman on cgroup v1); the model is told they are unlimited."""
    namespace: str = ""
    """The HTTP client (token) this registry serves; empty over stdio. Set by the server, not read
    from the environment: it goes into container names and labels."""
    disk_quota: int | None = None
    """Bytes this namespace's files may take (``HttpSettings.disk_quota`` for a token's namespace;
    None: no quota, the shared namespace). Set by the server, like ``namespace``."""
    http: HttpSettings = field(default_factory=HttpSettings)
    packages: PackageSettings = field(default_factory=PackageSettings)
    mounts: tuple[Mount, ...] = ()
    """``KERNELBRIDGE_MOUNTS`` and ``serve --mount``: host directories every sandbox sees read-only."""

    @property
    def packages_dir(self) -> Path:
        """The wheel cache shared by every session on this state directory."""
        return self.state_dir / "packages"

    @property
    def sessions_dir(self) -> Path:
        return self.state_dir / "sessions"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def connections_dir(self) -> Path:
        """Kernel connection files (mode 0600, in a 0700 directory)."""
        return self.state_dir / "connections"

    @property
    def run_dir(self) -> Path:
        """Working directory of tunnel processes and the runtime helpers they start."""
        return self.state_dir / "run"


def namespace_state_dir(state_dir: Path, namespace: str) -> Path:
    """The state directory of an HTTP token's namespace: ``<state dir>/http/<namespace>``, or
    ``state_dir`` itself for the shared namespace ``""`` (stdio, HTTP without authentication).

    With :func:`namespace_names`, the one place that knows where namespaces live (what lives below
    each, sessions and journals, is :mod:`kernelbridge.session.store`'s; exports and saved tools
    are there too). Here, below every layer, because the hub keeps saved tools per namespace as
    well. Raises ConfigError for a name that is not a namespace (it could leave the tree).
    """
    if not namespace:
        return state_dir
    if not _NAMESPACE.match(namespace):
        raise ConfigError(f"{namespace[:80]!r} is not a namespace name ([a-z0-9-], up to 64 characters)")
    return state_dir / HTTP_DIR / namespace


def namespace_names(state_dir: Path) -> list[str]:
    """The namespaces that have a state directory below ``state_dir``: the shared one (``""``)
    first, then the HTTP tokens' in name order (directories that are not namespaces ignored)."""
    try:
        found = [entry.name for entry in (state_dir / HTTP_DIR).iterdir() if entry.is_dir()]
    except OSError:
        found = []
    return ["", *sorted(name for name in found if _NAMESPACE.match(name))]


def default_state_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "state")
    return Path(base) / "kernelbridge"


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read settings from ``env`` (default: ``os.environ``). Raises ConfigError on a bad value."""
    env = os.environ if env is None else env
    state = _env.lookup(env, "STATE_DIR")
    runtime = _env.lookup(env, "RUNTIME")
    if runtime and runtime[1] not in RUNTIMES:
        raise ConfigError(
            f"{runtime[0]}={runtime[1]!r}: expected podman or docker "
            "(or podman-api, docker-api, podman-cli, docker-cli to pick how it is driven)"
        )
    image = _env.lookup(env, "IMAGE")
    servers = _env.lookup(env, "SERVERS_CONFIG")
    export_dir = _env.lookup(env, "EXPORT_DIR")
    defaults = SandboxLimits()
    limits = SandboxLimits(
        memory=_env.size(env, "MEMORY", defaults.memory),
        pids=int(_env.number(env, "PIDS", defaults.pids, minimum=8, integer=True)),
        cpus=_env.number(env, "CPUS", defaults.cpus, minimum=0.1, integer=False),
        tmp_size=_env.size(env, "TMP_SIZE", defaults.tmp_size),
        workspace_size=_env.size(env, "WORKSPACE_SIZE", defaults.workspace_size),
    )
    packages = _package_settings(env)
    limits = dataclasses.replace(limits, packages_size=tmpfs_size(packages.max_bytes))
    # The predecessor called it MCP_BRIDGE_TIMEOUT; both of its spellings are honoured.
    default_timeout = _env.number(
        env, "DEFAULT_TIMEOUT", 30.0, minimum=1, integer=False, aliases=("TIMEOUT",)
    )
    max_timeout = _env.number(env, "MAX_TIMEOUT", 600.0, minimum=1, integer=False)
    if default_timeout > max_timeout:
        raise ConfigError(f"default timeout {default_timeout:g}s exceeds the maximum {max_timeout:g}s")
    state_dir = Path(state[1]).expanduser() if state else default_state_dir(env)
    mounts = _env.lookup(env, "MOUNTS")
    return Settings(
        state_dir=state_dir,
        runtime=runtime[1] if runtime else None,
        image=image[1] if image else None,
        max_sessions=int(_env.number(env, "MAX_SESSIONS", 8, minimum=1, integer=True)),
        idle_timeout=_env.number(env, "IDLE_TIMEOUT", 1800.0, minimum=1, integer=False),
        warm_pool=int(_env.number(env, "WARM_POOL", 1, minimum=0, integer=True)),
        durable=_env.flag(env, "DURABLE", default=True),
        auto_restore=_env.flag(env, "AUTO_RESTORE", default=False),
        detached_buffer=_env.byte_size(env, "DETACHED_BUFFER", 32 * 1024 * 1024, minimum=64 * 1024),
        default_timeout=default_timeout,
        max_timeout=max_timeout,
        output_limit=int(_env.number(env, "OUTPUT_LIMIT", 20_000, minimum=200, integer=True)),
        servers_config=tuple(Path(p).expanduser() for p in servers[1].split(os.pathsep)) if servers else (),
        allow_servers=_env.names(env, "ALLOW_SERVERS"),
        deny_servers=_env.names(env, "DENY_SERVERS"),
        deny_tools=_env.names(env, "DENY_TOOLS", dotted=True),
        approve_tools=_env.names(env, "APPROVE_TOOLS", dotted=True),
        client_configs=_clients(env),
        project=_project(env),
        limits=limits,
        kernel_start_timeout=_env.number(env, "KERNEL_START_TIMEOUT", 60.0, minimum=1, integer=False),
        labels=_env.labels(env),
        engine=_engine_settings(env),
        image_packages=_env.requirements(env, "IMAGE_PACKAGES"),
        image_requirements=_env.path(env, "IMAGE_REQUIREMENTS"),
        allow_unlimited=_env.flag(env, "ALLOW_UNLIMITED"),
        http=_http_settings(env),
        image_budget=int(_env.number(env, "IMAGE_BUDGET", 50_000, minimum=1000, integer=True)),
        export_dir=Path(export_dir[1]).expanduser() if export_dir else None,
        journal_budget=_env.byte_size(env, "JOURNAL_BUDGET", 64 * 1024 * 1024, minimum=64 * 1024),
        packages=packages,
        mounts=parse_mounts(mounts[1], state_dir, where=mounts[0]) if mounts else (),
        history_budget=_env.byte_size(env, "HISTORY_BUDGET", 1024**3, minimum=0),
    )


def _clients(env: Mapping[str, str]) -> tuple[str, ...]:
    found = _env.lookup(env, "CLIENT_CONFIGS")
    if found is None:
        return CLIENTS
    var, raw = found
    items = [item.strip().lower() for item in raw.split(",") if item.strip()]
    if items == ["all"]:
        return CLIENTS
    if items == ["none"]:
        return ()
    for item in items:
        if item not in CLIENTS:
            raise ConfigError(f"{var}: {item!r} is not one of all, none, {', '.join(CLIENTS)}")
    return tuple(c for c in CLIENTS if c in items)


def _project(env: Mapping[str, str]) -> Path | None:
    found = _env.lookup(env, "PROJECT")
    return Path(found[1]).expanduser().absolute() if found else None


def _package_settings(env: Mapping[str, str]) -> PackageSettings:
    found = _env.lookup(env, "PACKAGES")
    policy, allowed = parse_policy(*found) if found is not None else ("any", frozenset[str]())
    return PackageSettings(
        policy=policy,
        allowed=allowed,
        max_bytes=_env.byte_size(env, "PACKAGES_MAX_BYTES", 128 * 1024**2, minimum=1024**2),
        max_installs=int(_env.number(env, "PACKAGES_MAX_INSTALLS", 32, minimum=0, integer=True)),
        cache_bytes=_env.byte_size(env, "PACKAGES_CACHE", 4 * 1024**3, minimum=16 * 1024**2),
    )


def _http_settings(env: Mapping[str, str]) -> HttpSettings:
    tokens = _env.lookup(env, "HTTP_TOKENS")
    return HttpSettings(
        tokens=tuple(t.strip() for t in tokens[1].split(",") if t.strip()) if tokens else (),
        tokens_file=_env.path(env, "HTTP_TOKENS_FILE"),
        allowed_hosts=_env.names(env, "HTTP_ALLOWED_HOSTS"),
        max_sessions=int(_env.number(env, "HTTP_MAX_SESSIONS", 4, minimum=1, integer=True)),
        max_calls=int(_env.number(env, "HTTP_MAX_CALLS", 4, minimum=1, integer=True)),
        disk_quota=_env.byte_size(env, "HTTP_DISK_QUOTA", 2 * 1024**3, minimum=1024**2),
    )


def _engine_settings(env: Mapping[str, str]) -> EngineSettings:
    urls = _env.lookup(env, "ENGINES")
    cert_path = (env.get("DOCKER_CERT_PATH") or "").strip()
    return EngineSettings(
        urls=tuple(u for u in re.split(r"[\s,]+", urls[1]) if u) if urls else (),
        docker_host=(env.get("DOCKER_HOST") or "").strip() or None,
        container_host=(env.get("CONTAINER_HOST") or "").strip() or None,
        # docker treats any non-empty value as "on" (even "0"); so do we, to find the same engine.
        tls_verify=bool((env.get("DOCKER_TLS_VERIFY") or "").strip()),
        tls=bool((env.get("DOCKER_TLS") or "").strip()),
        cert_path=Path(cert_path).expanduser() if cert_path else None,
        ssh_command=_env.ssh_command(env),
    )


def check_state_dir(settings: Settings) -> None:
    """Create the state directory and its parts, and prove they can be written.

    Raises ConfigError with one line when they cannot: the bridge would otherwise start and then
    fail deep inside its first call (a file where the directory should be, a read-only mount).
    A directory that is merely full is not refused: writes to it fail later, one at a time, and
    each failure is reported where it happens.
    """
    root = settings.state_dir
    try:
        for directory in (root, settings.sessions_dir, settings.connections_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = settings.sessions_dir / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            return
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"the state directory {root} cannot be used ({reason}: {exc.filename}); "
            "set KERNELBRIDGE_STATE_DIR to a writable directory"
        ) from None
