"""Settings: read once from ``KERNELBRIDGE_*`` environment variables into frozen dataclasses.

Every setting has a ``KERNELBRIDGE_<NAME>`` variable; the stateless predecessor's
``MCP_BRIDGE_<NAME>`` is accepted as a fallback so existing client configs keep working.
A bad value raises :class:`ConfigError` naming the variable, the value and what is expected.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernelbridge.errors import ConfigError

_SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)

HTTP_DIR = "http"
"""HTTP tokens' namespaces keep their state in ``<state dir>/http/<namespace>/``."""
_NAMESPACE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")

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
    """Seconds after which an unused session's sandbox is closed."""
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


def _lookup(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for prefix in ("KERNELBRIDGE_", "MCP_BRIDGE_"):
        value = env.get(prefix + name)
        if value is not None and value.strip() != "":
            return prefix + name, value.strip()
    return None


def _number(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float,
    integer: bool,
    aliases: tuple[str, ...] = (),
) -> float:
    found = _lookup(env, name) or next(filter(None, (_lookup(env, alias) for alias in aliases)), None)
    if found is None:
        return default
    var, raw = found
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{var}={raw!r} is not {kind}") from None
    if value < minimum:
        raise ConfigError(f"{var}={raw!r} must be at least {minimum:g}")
    return value


def _size(env: Mapping[str, str], name: str, default: str) -> str:
    found = _lookup(env, name)
    if found is None:
        return default
    var, raw = found
    if not _SIZE.match(raw):
        raise ConfigError(f"{var}={raw!r} is not a size such as 512m or 1g")
    return raw.lower()


def _names(env: Mapping[str, str], name: str, *, dotted: bool = False) -> tuple[str, ...]:
    """A comma-separated list of names or fnmatch patterns; ``dotted`` requires ``server.tool``."""
    found = _lookup(env, name)
    if found is None:
        return ()
    var, raw = found
    items = tuple(item.strip() for item in raw.split(",") if item.strip())
    for item in items:
        if dotted and "." not in item and item != "*":
            raise ConfigError(f"{var}: {item!r} is not a server.tool pattern (e.g. github.delete_*)")
    return items


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _labels(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    found = _lookup(env, "LABELS")
    if found is None:
        return ()
    var, raw = found
    labels = []
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        if (
            not sep
            or not _LABEL_KEY.match(key)
            or (key.startswith("kernelbridge.") and key in _RESERVED_LABELS)
        ):
            raise ConfigError(f"{var}: {item!r} is not a key=value label (or uses a reserved key)")
        labels.append((key, value))
    return tuple(labels)


_RESERVED_LABELS = frozenset({"kernelbridge.session", "kernelbridge.owner", "kernelbridge.host"})


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
    state = _lookup(env, "STATE_DIR")
    runtime = _lookup(env, "RUNTIME")
    if runtime and runtime[1] not in RUNTIMES:
        raise ConfigError(
            f"{runtime[0]}={runtime[1]!r}: expected podman or docker "
            "(or podman-api, docker-api, podman-cli, docker-cli to pick how it is driven)"
        )
    image = _lookup(env, "IMAGE")
    servers = _lookup(env, "SERVERS_CONFIG")
    export_dir = _lookup(env, "EXPORT_DIR")
    defaults = SandboxLimits()
    limits = SandboxLimits(
        memory=_size(env, "MEMORY", defaults.memory),
        pids=int(_number(env, "PIDS", defaults.pids, minimum=8, integer=True)),
        cpus=_number(env, "CPUS", defaults.cpus, minimum=0.1, integer=False),
        tmp_size=_size(env, "TMP_SIZE", defaults.tmp_size),
        workspace_size=_size(env, "WORKSPACE_SIZE", defaults.workspace_size),
    )
    # The predecessor called it MCP_BRIDGE_TIMEOUT; both of its spellings are honoured.
    default_timeout = _number(env, "DEFAULT_TIMEOUT", 30.0, minimum=1, integer=False, aliases=("TIMEOUT",))
    max_timeout = _number(env, "MAX_TIMEOUT", 600.0, minimum=1, integer=False)
    if default_timeout > max_timeout:
        raise ConfigError(f"default timeout {default_timeout:g}s exceeds the maximum {max_timeout:g}s")
    return Settings(
        state_dir=Path(state[1]).expanduser() if state else default_state_dir(env),
        runtime=runtime[1] if runtime else None,
        image=image[1] if image else None,
        max_sessions=int(_number(env, "MAX_SESSIONS", 8, minimum=1, integer=True)),
        idle_timeout=_number(env, "IDLE_TIMEOUT", 1800.0, minimum=1, integer=False),
        warm_pool=int(_number(env, "WARM_POOL", 1, minimum=0, integer=True)),
        default_timeout=default_timeout,
        max_timeout=max_timeout,
        output_limit=int(_number(env, "OUTPUT_LIMIT", 20_000, minimum=200, integer=True)),
        servers_config=tuple(Path(p).expanduser() for p in servers[1].split(os.pathsep)) if servers else (),
        allow_servers=_names(env, "ALLOW_SERVERS"),
        deny_servers=_names(env, "DENY_SERVERS"),
        deny_tools=_names(env, "DENY_TOOLS", dotted=True),
        limits=limits,
        kernel_start_timeout=_number(env, "KERNEL_START_TIMEOUT", 60.0, minimum=1, integer=False),
        labels=_labels(env),
        engine=_engine_settings(env),
        image_packages=_requirements(env, "IMAGE_PACKAGES"),
        image_requirements=_path(env, "IMAGE_REQUIREMENTS"),
        allow_unlimited=_flag(env, "ALLOW_UNLIMITED"),
        http=_http_settings(env),
        image_budget=int(_number(env, "IMAGE_BUDGET", 50_000, minimum=1000, integer=True)),
        export_dir=Path(export_dir[1]).expanduser() if export_dir else None,
        journal_budget=_bytes(env, "JOURNAL_BUDGET", 64 * 1024 * 1024, minimum=64 * 1024),
        history_budget=_bytes(env, "HISTORY_BUDGET", 1024**3, minimum=0),
    )


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def _bytes(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    """A size in bytes: a number, or a number with k, m or g (binary units)."""
    found = _lookup(env, name)
    raw = _size(env, name, "")
    if found is None or not raw:
        return default
    unit = raw[-1] if raw[-1].isalpha() else ""
    value = int(float(raw[: len(raw) - len(unit)]) * _UNITS[unit])
    if value < minimum:
        raise ConfigError(f"{found[0]}={raw!r} must be at least {minimum // 1024} KiB")
    return value


# Between two requirements: spaces, or a comma before the next name ("polars>=1,<2" stays one).
_REQUIREMENT_SEPARATOR = re.compile(r"\s+|,\s*(?=[A-Za-z0-9])")


def _requirements(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Python package requirements separated by spaces or commas (checked by the image module)."""
    found = _lookup(env, name)
    if found is None:
        return ()
    return tuple(item for item in _REQUIREMENT_SEPARATOR.split(found[1]) if item)


def _path(env: Mapping[str, str], name: str) -> Path | None:
    found = _lookup(env, name)
    return Path(found[1]).expanduser() if found else None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(env: Mapping[str, str], name: str) -> bool:
    found = _lookup(env, name)
    if found is None:
        return False
    var, raw = found
    if raw.lower() not in _TRUE + _FALSE:
        raise ConfigError(f"{var}={raw!r}: expected 1 or 0")
    return raw.lower() in _TRUE


def _http_settings(env: Mapping[str, str]) -> HttpSettings:
    tokens = _lookup(env, "HTTP_TOKENS")
    return HttpSettings(
        tokens=tuple(t.strip() for t in tokens[1].split(",") if t.strip()) if tokens else (),
        tokens_file=_path(env, "HTTP_TOKENS_FILE"),
        allowed_hosts=_names(env, "HTTP_ALLOWED_HOSTS"),
        max_sessions=int(_number(env, "HTTP_MAX_SESSIONS", 4, minimum=1, integer=True)),
        max_calls=int(_number(env, "HTTP_MAX_CALLS", 4, minimum=1, integer=True)),
        disk_quota=_bytes(env, "HTTP_DISK_QUOTA", 2 * 1024**3, minimum=1024**2),
    )


def _engine_settings(env: Mapping[str, str]) -> EngineSettings:
    urls = _lookup(env, "ENGINES")
    cert_path = (env.get("DOCKER_CERT_PATH") or "").strip()
    return EngineSettings(
        urls=tuple(u for u in re.split(r"[\s,]+", urls[1]) if u) if urls else (),
        docker_host=(env.get("DOCKER_HOST") or "").strip() or None,
        container_host=(env.get("CONTAINER_HOST") or "").strip() or None,
        # docker treats any non-empty value as "on" (even "0"); so do we, to find the same engine.
        tls_verify=bool((env.get("DOCKER_TLS_VERIFY") or "").strip()),
        tls=bool((env.get("DOCKER_TLS") or "").strip()),
        cert_path=Path(cert_path).expanduser() if cert_path else None,
        ssh_command=_ssh_command(env),
    )


def _ssh_command(env: Mapping[str, str]) -> tuple[str, ...]:
    found = _lookup(env, "SSH_COMMAND")
    if found is None:
        return ("ssh",)
    var, raw = found
    try:
        words = tuple(shlex.split(raw))
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is not a command line: {exc}") from None
    if not words:
        raise ConfigError(f"{var} is empty")
    return words


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
