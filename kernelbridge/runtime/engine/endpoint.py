"""Where a container engine's API is, and how to speak to it: URLs, TLS material, default sockets.

Engine URLs are read as the docker and podman clients read them (``DOCKER_HOST``, ``CONTAINER_HOST``,
``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``). No I/O beyond reading certificate files::

    unix:///run/podman/podman.sock      a local socket
    tcp://host:2375                     plain HTTP (TLS when DOCKER_TLS_VERIFY / DOCKER_TLS is set)
    https://host:2376                   TLS, whatever the variables say
    ssh://user@host[:port][/socket]     the engine's socket on another machine, through ssh
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from kernelbridge.config import EngineSettings
from kernelbridge.errors import ConfigError

Scheme = Literal["unix", "tcp", "ssh"]
Engine = Literal["podman", "docker"]

DOCKER_SOCKET = "/var/run/docker.sock"
PODMAN_ROOT_SOCKET = "/run/podman/podman.sock"
PLAIN_PORT = 2375
TLS_PORT = 2376
SSH_PORT = 22
UNIX_PATH_MAX = 107
"""sun_path holds 108 bytes with the terminating NUL: a longer socket path cannot be bound."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The TLS material of a ``tcp://`` endpoint, docker's layout (``ca.pem``, ``cert.pem``, ``key.pem``)."""

    verify: bool
    """Check the engine's certificate against ``ca.pem`` and its host name (``DOCKER_TLS_VERIFY``)."""
    cert_path: Path


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine's address."""

    scheme: Scheme
    path: str = ""
    """Socket path: the local one for ``unix``, the remote one for ``ssh`` (empty: the engine's default)."""
    host: str = ""
    port: int = 0
    user: str = ""
    tls: TlsFiles | None = None

    @property
    def url(self) -> str:
        """The endpoint as a URL, for messages and ``doctor`` (never holds a secret)."""
        if self.scheme == "unix":
            return f"unix://{self.path}"
        if self.scheme == "ssh":
            who = f"{self.user}@" if self.user else ""
            return f"ssh://{who}{self.host}:{self.port}{self.path}"
        return f"{'https' if self.tls else 'tcp'}://{_bracket(self.host)}:{self.port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_endpoint(url: str, engine_settings: EngineSettings | None = None) -> Endpoint:
    """Parse an engine URL; ``tcp://`` takes its TLS settings from ``engine_settings``.

    Raises ConfigError naming the URL and what is expected.
    """
    es = engine_settings or EngineSettings()
    url = url.strip()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "unix":
        path = unquote(parts.path) or unquote(parts.netloc)
        if not path.startswith("/"):
            raise ConfigError(f"engine URL {url!r}: a unix socket needs an absolute path (unix:///path)")
        return Endpoint("unix", path=path)
    if scheme in ("tcp", "http", "https"):
        if not parts.hostname:
            raise ConfigError(f"engine URL {url!r} has no host (expected tcp://host:port)")
        use_tls = scheme == "https" or (scheme == "tcp" and (es.tls_verify or es.tls))
        tls = None
        if use_tls:
            cert_path = es.cert_path or Path(os.path.expanduser("~/.docker"))
            tls = TlsFiles(verify=es.tls_verify or scheme == "https", cert_path=cert_path)
        try:
            port = parts.port or (TLS_PORT if tls else PLAIN_PORT)
        except ValueError:
            raise ConfigError(f"engine URL {url!r} has a bad port") from None
        return Endpoint("tcp", host=parts.hostname, port=port, tls=tls)
    if scheme == "ssh":
        if not parts.hostname:
            raise ConfigError(f"engine URL {url!r} has no host (expected ssh://user@host[:port][/socket])")
        try:
            port = parts.port or SSH_PORT
        except ValueError:
            raise ConfigError(f"engine URL {url!r} has a bad port") from None
        return Endpoint("ssh", host=parts.hostname, port=port, user=parts.username or "", path=parts.path)
    raise ConfigError(f"engine URL {url!r}: expected unix://, tcp://, https:// or ssh://")


def ssl_context(tls: TlsFiles) -> ssl.SSLContext:
    """The client context docker builds from ``DOCKER_CERT_PATH``: ``ca.pem`` to verify the engine
    (when ``verify``), ``cert.pem``/``key.pem`` as the client certificate when present.

    Raises ConfigError when a needed file is missing or unreadable.
    """
    ca, cert, key = (tls.cert_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    try:
        if tls.verify:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
        else:
            # DOCKER_TLS without verification: encrypted, but the engine is not authenticated.
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert.exists() or key.exists():
            ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"cannot load the engine's TLS files from {tls.cert_path}: {reason}") from None
    return ctx


def system_sockets(engine: Engine, env: dict[str, str] | None = None) -> list[str]:
    """The sockets an engine's system service listens on by default, most likely first."""
    env = dict(os.environ) if env is None else env
    if engine == "docker":
        return [DOCKER_SOCKET]
    sockets = []
    if os.geteuid() == 0:
        sockets.append(PODMAN_ROOT_SOCKET)
    runtime_dir = env.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        sockets.append(f"{runtime_dir}/podman/podman.sock")
    if os.geteuid() != 0:
        sockets.append(PODMAN_ROOT_SOCKET)  # readable only if the admin made it so
    return sockets


def default_remote_socket(engine: Engine | None, endpoint: Endpoint) -> str:
    """The engine socket on the far side of ``ssh://`` when the URL names none.

    Raises ConfigError for a rootless podman, whose socket path holds a uid we cannot know here.
    """
    if endpoint.path:
        return endpoint.path
    if engine != "podman":
        return DOCKER_SOCKET
    if endpoint.user in ("", "root"):
        return PODMAN_ROOT_SOCKET
    raise ConfigError(
        f"engine URL {endpoint.url}: name the remote podman socket, "
        f"e.g. ssh://{endpoint.user}@{endpoint.host}/run/user/1000/podman/podman.sock"
    )
