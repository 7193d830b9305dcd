"""Settings: read once from ``KERNELBRIDGE_*`` environment variables into frozen dataclasses.

Every setting has a ``KERNELBRIDGE_<NAME>`` variable; the stateless predecessor's
``MCP_BRIDGE_<NAME>`` is accepted as a fallback so existing client configs keep working.
A bad value is one line naming the variable, the value and what is expected: raised as a
:class:`ConfigError`, or kept in ``Settings.problems`` for a bridge that must start all the same.

The package (it outgrew one module): ``records`` holds the settings records, ``env`` reads one
variable at a time, ``mounts`` checks the host directories a sandbox may see, ``packages`` holds
``%pip install``'s settings; this module holds :func:`load_settings` and the state directory's
layout.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shlex
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kernelbridge.config import env as _env
from kernelbridge.config.mounts import (
    PACKAGES_DIR,
    RESERVED_TARGETS,
    Mount,
    MountGuard,
    check_mount,
    check_mount_set,
    check_source,
    mount_guard,
    parse_mounts,
)
from kernelbridge.config.packages import PackageSettings, parse_policy, tmpfs_size
from kernelbridge.config.records import (
    CLIENTS,
    DEFAULT_IMAGE_PROFILE,
    IMAGE_PROFILES,
    RUNTIMES,
    EngineSettings,
    HttpSettings,
    ImageProfile,
    KubeSettings,
    SandboxLimits,
    Settings,
)
from kernelbridge.errors import ConfigError

__all__ = [
    "CLIENTS",
    "DEFAULT_IMAGE_PROFILE",
    "HTTP_DIR",
    "IMAGE_PROFILES",
    "PACKAGES_DIR",
    "RESERVED_TARGETS",
    "RUNTIMES",
    "ConfigError",
    "EngineSettings",
    "HttpSettings",
    "ImageProfile",
    "KubeSettings",
    "Mount",
    "MountGuard",
    "PackageSettings",
    "SandboxLimits",
    "Settings",
    "check_mount",
    "check_mount_set",
    "check_source",
    "check_state_dir",
    "default_state_dir",
    "load_settings",
    "misconfigured",
    "mount_guard_of",
    "namespace_names",
    "namespace_state_dir",
    "parse_mounts",
    "problems_line",
    "with_problem",
]

HTTP_DIR = "http"
"""HTTP tokens' namespaces keep their state in ``<state dir>/http/<namespace>/``."""
_NAMESPACE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


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


def load_settings(env: Mapping[str, str] | None = None, *, strict: bool = True) -> Settings:
    """Read settings from ``env`` (default: ``os.environ``).

    ``strict``: a bad value raises ConfigError (its line, and how many more there are). Otherwise
    each bad value is kept as one line in ``Settings.problems`` and its setting keeps its default:
    ``serve`` starts all the same (an MCP client shows none of the bridge's stderr, only a
    "connection closed") and refuses every sandbox saying the lines, and ``doctor`` lists them.
    """
    env = os.environ if env is None else env
    read = _Reader(env)
    settings = _read_settings(env, read)
    mounts = _env.lookup(env, "MOUNTS")
    if mounts:
        guard = mount_guard_of(settings, env)
        settings = dataclasses.replace(
            settings, mounts=read(lambda: parse_mounts(mounts[1], guard, where=mounts[0]), ())
        )
    settings = dataclasses.replace(settings, problems=tuple(read.problems))
    if strict and settings.problems:
        raise ConfigError(problems_line(settings.problems))
    return settings


def problems_line(problems: tuple[str, ...]) -> str:
    """Bad settings on one line: the first whole, then how many more (each is its own line in
    ``Settings.problems``; ``doctor`` shows them all)."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more bad setting{'s' * (more > 1)})" if more else "")


def misconfigured(problems: tuple[str, ...]) -> str:
    """Why a bridge with bad settings starts no sandbox: one line, with what to do."""
    return (
        f"kernelbridge is misconfigured: {problems_line(problems)}; fix it where the MCP client"
        " starts kernelbridge (its env or args) and restart it (`kernelbridge doctor` lists every"
        " bad setting)"
    )


def with_problem(settings: Settings, problem: str) -> Settings:
    """``settings`` with one more line in ``problems`` (a bad command-line value of ``serve``)."""
    return dataclasses.replace(settings, problems=(*settings.problems, problem))


T = TypeVar("T")
_Parse = Callable[[str, str], Any]
"""A variable's parser: (the variable found, its value) -> the setting; raises ConfigError."""
_Specs = Mapping[str, tuple[tuple[str, ...], _Parse]]
"""A record's fields read from the environment: field -> (its variables, strongest first; parser)."""


def _count(minimum: int) -> _Parse:
    return partial(_env.number, minimum=minimum, integer=True)


def _number(minimum: float) -> _Parse:
    return partial(_env.number, minimum=minimum, integer=False)


def _bytes(minimum: int) -> _Parse:
    return partial(_env.byte_size, minimum=minimum)


_DOTTED = partial(_env.names, dotted=True)
_V = _env.variables

_LIMITS: _Specs = {
    "memory": (_V("MEMORY"), _env.size),
    "pids": (_V("PIDS"), _count(8)),
    "cpus": (_V("CPUS"), _number(0.1)),
    "tmp_size": (_V("TMP_SIZE"), _env.size),
    "workspace_size": (_V("WORKSPACE_SIZE"), _env.size),
}
_PACKAGES: _Specs = {
    "max_bytes": (_V("PACKAGES_MAX_BYTES"), _bytes(1024**2)),
    "max_installs": (_V("PACKAGES_MAX_INSTALLS"), _count(0)),
    "cache_bytes": (_V("PACKAGES_CACHE"), _bytes(16 * 1024**2)),
}
_HTTP: _Specs = {
    "tokens": (_V("HTTP_TOKENS"), _env.names),
    "tokens_file": (_V("HTTP_TOKENS_FILE"), _env.path),
    "allowed_hosts": (_V("HTTP_ALLOWED_HOSTS"), _env.names),
    "max_sessions": (_V("HTTP_MAX_SESSIONS"), _count(1)),
    "max_calls": (_V("HTTP_MAX_CALLS"), _count(1)),
    "disk_quota": (_V("HTTP_DISK_QUOTA"), _bytes(1024**2)),
}
_ENGINE: _Specs = {
    "urls": (_V("ENGINES"), lambda var, raw: tuple(u for u in re.split(r"[\s,]+", raw) if u)),
    "ssh_command": (_V("SSH_COMMAND"), _env.ssh_command),
    # The docker and podman clients' own variables, read as they read them: docker takes any
    # non-empty DOCKER_TLS_VERIFY as "on" (even "0"); so do we, to find the same engine.
    "docker_host": (("DOCKER_HOST",), _env.text),
    "container_host": (("CONTAINER_HOST",), _env.text),
    "tls_verify": (("DOCKER_TLS_VERIFY",), lambda var, raw: True),
    "tls": (("DOCKER_TLS",), lambda var, raw: True),
    "cert_path": (("DOCKER_CERT_PATH",), _env.path),
}
_SETTINGS: _Specs = {
    "runtime": (_V("RUNTIME"), lambda var, raw: _runtime(var, raw)),
    "image": (_V("IMAGE"), _env.text),
    "image_profile": (_V("IMAGE_PROFILE"), partial(_env.choice, choices=IMAGE_PROFILES)),
    "max_sessions": (_V("MAX_SESSIONS"), _count(1)),
    "idle_timeout": (_V("IDLE_TIMEOUT"), _number(1)),
    "warm_pool": (_V("WARM_POOL"), _count(0)),
    "durable": (_V("DURABLE"), _env.flag),
    "auto_restore": (_V("AUTO_RESTORE"), _env.flag),
    "detached_buffer": (_V("DETACHED_BUFFER"), _bytes(64 * 1024)),
    # The predecessor called it MCP_BRIDGE_TIMEOUT; both of its spellings are honoured.
    "default_timeout": (_V("DEFAULT_TIMEOUT", "TIMEOUT"), _number(1)),
    "max_timeout": (_V("MAX_TIMEOUT"), _number(1)),
    "max_task_time": (_V("MAX_TASK_TIME"), _number(1)),
    "output_limit": (_V("OUTPUT_LIMIT"), _count(200)),
    "servers_config": (_V("SERVERS_CONFIG"), _env.paths),
    "allow_servers": (_V("ALLOW_SERVERS"), _env.names),
    "deny_servers": (_V("DENY_SERVERS"), _env.names),
    "deny_tools": (_V("DENY_TOOLS"), _DOTTED),
    "approve_tools": (_V("APPROVE_TOOLS"), _DOTTED),
    "client_configs": (_V("CLIENT_CONFIGS"), lambda var, raw: _clients(var, raw)),
    "project": (_V("PROJECT"), lambda var, raw: Path(raw).expanduser().absolute()),
    "kernel_start_timeout": (_V("KERNEL_START_TIMEOUT"), _number(1)),
    "labels": (_V("LABELS"), _env.labels),
    "image_packages": (_V("IMAGE_PACKAGES"), _env.requirements),
    "image_requirements": (_V("IMAGE_REQUIREMENTS"), _env.path),
    "allow_unlimited": (_V("ALLOW_UNLIMITED"), _env.flag),
    "image_budget": (_V("IMAGE_BUDGET"), _count(1000)),
    "export_dir": (_V("EXPORT_DIR"), _env.path),
    "journal_budget": (_V("JOURNAL_BUDGET"), _bytes(64 * 1024)),
    "history_budget": (_V("HISTORY_BUDGET"), _bytes(0)),
}
"""Every setting read from a variable. An unset one is not passed to its record: the record's
field default is the one default of each setting."""


class _Reader:
    """Reads settings from ``env``, keeping each bad one's line (and its default) instead of
    stopping at the first."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []

    def __call__(self, parse: Callable[[], T], default: T) -> T:
        try:
            return parse()
        except ConfigError as exc:
            self.problems.append(str(exc))
            return default

    def given(self, specs: _Specs) -> dict[str, Any]:
        """The fields of ``specs`` whose variable is set to a good value (a bad one is a problem);
        the others are left out, so the record gives them its defaults."""
        fields: dict[str, Any] = {}
        for name, (variables, parse) in specs.items():
            found = _env.find(self.env, variables)
            if found is not None:
                try:
                    fields[name] = parse(*found)
                except ConfigError as exc:
                    self.problems.append(str(exc))
        return fields


def _read_settings(env: Mapping[str, str], read: _Reader) -> Settings:
    state = _env.lookup(env, "STATE_DIR")
    limits = read.given(_LIMITS)
    packages = _package_settings(env, read)
    limits["packages_size"] = tmpfs_size(packages.max_bytes)
    fields = read.given(_SETTINGS)
    settings = Settings(
        state_dir=Path(state[1]).expanduser() if state else default_state_dir(env),
        limits=SandboxLimits(**limits),
        engine=EngineSettings(**read.given(_ENGINE)),
        http=HttpSettings(**read.given(_HTTP)),
        kube=read(partial(_kube_settings, env), KubeSettings()),
        packages=packages,
        **fields,
    )
    if settings.default_timeout > settings.max_timeout:
        read.problems.append(
            f"default timeout {settings.default_timeout:g}s exceeds the maximum {settings.max_timeout:g}s"
        )
        default = next(f.default for f in dataclasses.fields(Settings) if f.name == "default_timeout")
        assert isinstance(default, float)  # back to its default, and the maximum at least that
        settings = dataclasses.replace(
            settings, default_timeout=default, max_timeout=max(default, settings.max_timeout)
        )
    return settings


def _runtime(var: str, raw: str) -> str:
    if raw not in RUNTIMES:
        raise ConfigError(
            f"{var}={raw!r}: expected podman or docker "
            "(or podman-api, docker-api, podman-cli, docker-cli to pick how it is driven; kube for a cluster)"
        )
    return raw


def mount_guard_of(settings: Settings, env: Mapping[str, str] | None = None) -> MountGuard:
    """What no mount source of a bridge with ``settings`` may be, hold or lie inside
    (:func:`~kernelbridge.config.mounts.mount_guard`): the host's paths, the user's credentials
    (by ``env``'s ``HOME``, default ``os.environ``) and the files these settings name."""
    env = os.environ if env is None else env
    private: list[tuple[Path, str]] = []
    if settings.export_dir is not None:
        private.append((settings.export_dir, "every session's exported notebooks"))
    if settings.http.tokens_file is not None:
        private.append((settings.http.tokens_file, "the HTTP bearer tokens"))
    private += [(path, "host MCP server definitions and their tokens") for path in settings.servers_config]
    engine = settings.engine
    for url in (*engine.urls, engine.docker_host or "", engine.container_host or ""):
        if url.startswith("unix://"):
            private.append((Path(url.removeprefix("unix://")), "a container engine's socket"))
    if engine.cert_path is not None:
        private.append((engine.cert_path, "the engine's TLS keys"))
    return mount_guard(settings.state_dir, env, private=private)


def _clients(var: str, raw: str) -> tuple[str, ...]:
    items = [item.strip().lower() for item in raw.split(",") if item.strip()]
    if items == ["all"]:
        return CLIENTS
    if items == ["none"]:
        return ()
    for item in items:
        if item not in CLIENTS:
            raise ConfigError(f"{var}: {item!r} is not one of all, none, {', '.join(CLIENTS)}")
    return tuple(c for c in CLIENTS if c in items)


def _package_settings(env: Mapping[str, str], read: _Reader) -> PackageSettings:
    fields = read.given(_PACKAGES)
    found = _env.lookup(env, "PACKAGES")
    if found:
        # A bad policy installs nothing until it is fixed (its default, any, is not what was asked).
        refused: tuple[str, frozenset[str]] = ("none", frozenset())
        fields["policy"], fields["allowed"] = read(partial(parse_policy, *found), refused)
    return PackageSettings(**fields)


_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _kube_settings(env: Mapping[str, str]) -> KubeSettings:
    base = KubeSettings()
    found = _env.lookup(env, "KUBE_NAMESPACE")
    namespace = found[1].strip() if found else base.namespace
    if found and not _NAMESPACE.match(namespace):
        raise ConfigError(f"{found[0]}={found[1]!r}: not a namespace name (lowercase letters, digits, '-')")
    runtime_class = _env.lookup(env, "KUBE_RUNTIME_CLASS")
    loader = _env.lookup(env, "KUBE_IMAGE_LOADER")
    try:
        loader_argv = tuple(shlex.split(loader[1])) if loader else ()
    except ValueError as exc:
        raise ConfigError(f"{loader[0] if loader else ''}: {exc}") from None
    kubeconfig = (env.get("KUBECONFIG") or "").split(os.pathsep)[0].strip()
    return KubeSettings(
        namespace=namespace,
        runtime_class=runtime_class[1].strip() or None if runtime_class else None,
        kubeconfig=Path(kubeconfig).expanduser() if kubeconfig else None,
        image_loader=loader_argv,
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
