"""``kernelbridge serve --http``: who may connect, as whom, and on which address.

Every request passes :class:`HttpGuard` before the MCP SDK sees it: first ``Host`` and ``Origin``
against the allowed hosts (421/403, on every bind, before the token, so a browser cannot even probe
tokens), then the bearer token, compared in constant time with every configured one. The token's
name goes into the ASGI scope as the request's namespace (:func:`namespace_of`) and the SDK's
principal. A non-loopback bind is refused without tokens and without an explicit allowed-hosts list.
This module knows nothing about sessions or sandboxes.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError
from kernelbridge.server.departure import Departure

log = logging.getLogger("kernelbridge.server")

NAMESPACE_KEY = "kernelbridge.namespace"
"""The ASGI scope key holding the namespace of an authenticated request."""
TOKEN_FILE = "http-token"
"""The generated token's file in the state directory."""
MIN_TOKEN_CHARS = 16
"""Shorter tokens are refused: they could be guessed over the network."""
GENERATED_TOKEN_BYTES = 32
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
"""Token names become directory names and parts of container names: short and plain."""


# -- tokens ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TokenTable:
    """The accepted tokens, kept as sha256 digests, each with its namespace."""

    entries: tuple[tuple[bytes, str], ...] = field(repr=False)

    def namespace(self, presented: str) -> str | None:
        """The namespace of ``presented``, or None. Every entry is compared, in constant time."""
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, namespace in self.entries:
            if hmac.compare_digest(digest, known):
                found = namespace
        return found

    @property
    def namespaces(self) -> list[str]:
        return sorted({namespace for _, namespace in self.entries})


def parse_token(entry: str, where: str) -> tuple[bytes, str]:
    """(digest, namespace) of a ``name:token`` or bare ``token`` entry. Raises ConfigError."""
    name, sep, secret = entry.strip().partition(":")
    if not sep or not _NAME.match(name):
        name, secret = "", entry.strip()
    if len(secret) < MIN_TOKEN_CHARS:
        label = f"the token of {name!r}" if name else "a token"
        raise ConfigError(
            f"{where}: {label} has {len(secret)} characters; use at least {MIN_TOKEN_CHARS}"
            " random ones (e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    digest = hashlib.sha256(secret.encode()).digest()
    # A bare token still needs a stable namespace that does not reveal it.
    return digest, name or f"t{digest.hex()[:10]}"


def load_tokens(settings: Settings, announce: Any = None) -> TokenTable:
    """The tokens of ``settings.http``, or the generated one (created and announced at the first
    start). ``announce`` (default: stderr) gets the one-time message with a new token."""
    entries = [parse_token(t, "KERNELBRIDGE_HTTP_TOKENS") for t in settings.http.tokens]
    if (path := settings.http.tokens_file) is not None:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            why = exc.strerror
            raise ConfigError(f"KERNELBRIDGE_HTTP_TOKENS_FILE={path}: cannot read it ({why})") from None
        where = f"KERNELBRIDGE_HTTP_TOKENS_FILE ({path})"
        entries += [parse_token(line, where) for line in lines if line.strip() and not line.startswith("#")]
        if not entries:
            raise ConfigError(f"{where} holds no token: add one `name:token` per line")
    if not entries:
        entries.append(parse_token(generated_token(settings.state_dir, announce), TOKEN_FILE))
    return TokenTable(tuple(entries))


def generated_token(state_dir: Path, announce: Any = None) -> str:
    """The token in ``<state_dir>/http-token``, created (0600, atomically) if missing; a new one is
    announced once, on stderr: it is the only time it is shown."""
    path = state_dir / TOKEN_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot read the HTTP token file {path} ({exc.strerror})") from None
    token = secrets.token_urlsafe(GENERATED_TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another bridge made it meanwhile: use theirs
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot create the HTTP token file {path} ({exc.strerror})") from None
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    (announce or _stderr)(
        f"kernelbridge: generated an HTTP bearer token (shown once; kept in {path}, mode 0600):\n"
        f"    Authorization: Bearer {token}"
    )
    return token


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- hosts ------------------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, str | None]:
    """(name, port or None) of a Host header or an allowed-host entry; IPv6 keeps its brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, None
        rest = value[end + 1 :]
        return value[: end + 1], rest[1:] if rest.startswith(":") else None
    name, sep, port = value.rpartition(":")
    return (name, port) if sep and name else (value, None)


@dataclass(frozen=True, slots=True)
class HostRules:
    """Which Host (and Origin) values a bridge answers. An entry without a port, or with ``:*``,
    accepts any port; ``name:8765`` only that one."""

    allowed: tuple[str, ...]

    def host_ok(self, host: str | None) -> bool:
        if not host:
            return False
        name, port = split_host(host)
        for entry in self.allowed:
            want_name, want_port = split_host(entry)
            if name == want_name and want_port in (None, "*", port):
                return True
        return False

    def origin_ok(self, origin: str | None) -> bool:
        """No Origin (not a browser, or same-origin) is fine; else its host must be allowed."""
        if not origin:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and self.host_ok(parts.netloc)


# -- options ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HttpOptions:
    """How ``serve --http`` listens; built by :meth:`from_args`, which refuses unsafe combinations."""

    host: str
    port: int
    hosts: HostRules
    tokens: TokenTable | None
    """None: no authentication (loopback only, every client shares one namespace)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @classmethod
    def from_args(
        cls,
        settings: Settings,
        *,
        host: str,
        port: int,
        allowed_hosts: list[str],
        tls_cert: str | None,
        tls_key: str | None,
        auth: bool,
        announce: Any = None,
    ) -> HttpOptions:
        """Raises ConfigError for a non-loopback bind without tokens or allowed hosts, and for
        half a TLS configuration."""
        loopback = is_loopback(host)
        if not auth and not loopback:
            raise ConfigError(
                f"refusing to serve {host} without authentication: anyone who can reach it could run"
                " code as you; drop --no-auth (bearer tokens are the default)"
            )
        allowed = tuple(allowed_hosts) + settings.http.allowed_hosts
        if not allowed:
            if not loopback:
                raise ConfigError(
                    f"serving {host} needs the host names clients will use (they are checked against"
                    " DNS rebinding): pass --allowed-host NAME (repeatable) or set"
                    " KERNELBRIDGE_HTTP_ALLOWED_HOSTS"
                )
            allowed = LOOPBACK_HOSTS
        if bool(tls_cert) != bool(tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        for path in (tls_cert, tls_key):
            if path and not Path(path).is_file():
                raise ConfigError(f"no such TLS file: {path}")
        if not loopback and not tls_cert:
            log.warning(
                "serving %s over plain HTTP: bearer tokens cross the network in clear text unless a"
                " TLS reverse proxy is in front (or use --tls-cert/--tls-key)",
                host,
            )
        if not auth:
            log.warning("serving HTTP without authentication: every local user can run code as you")
        return cls(
            host=host,
            port=port,
            hosts=HostRules(allowed),
            tokens=load_tokens(settings, announce) if auth else None,
            tls_cert=Path(tls_cert) if tls_cert else None,
            tls_key=Path(tls_key) if tls_key else None,
        )


# -- the guard --------------------------------------------------------------------------------------------
class HttpGuard:
    """ASGI middleware in front of the MCP app: Host/Origin, then the bearer token (see module doc)."""

    def __init__(self, app: ASGIApp, hosts: HostRules, tokens: TokenTable | None) -> None:
        self.app = app
        self.hosts = hosts
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan events
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        if not self.hosts.host_ok(headers.get("host")):
            log.warning("refused a request for Host %r", (headers.get("host") or "")[:100])
            await _reply(send, 421, "misdirected_request", "this Host is not served here")
            return
        if not self.hosts.origin_ok(headers.get("origin")):
            log.warning("refused a request from Origin %r", (headers.get("origin") or "")[:100])
            await _reply(send, 403, "forbidden_origin", "requests from this Origin are refused")
            return
        if self.tokens is not None:
            scheme, _, presented = headers.get("authorization", "").partition(" ")
            namespace = self.tokens.namespace(presented.strip()) if scheme.lower() == "bearer" else None
            if namespace is None:
                await _reply(send, 401, "invalid_token", "a valid bearer token is required")
                return
            scope = dict(scope)
            scope[NAMESPACE_KEY] = namespace
            # The SDK binds each MCP session to the principal that opened it.
            scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=namespace, scopes=[]))
        await self.app(scope, receive, send)


async def _reply(send: Send, status: int, error: str, description: str) -> None:
    body = json.dumps({"error": error, "error_description": description}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", f'Bearer error="{error}"'.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def namespace_of(ctx: Context) -> str:
    """The namespace of the request behind ``ctx``: its token's, or "" (stdio, or HTTP without auth)."""
    return namespace_of_request(ctx.request_context.request)


def namespace_of_request(request: object) -> str:
    """The namespace of a transport's ``request`` (a request context's ``request``)."""
    scope = getattr(request, "scope", None)
    return str(scope.get(NAMESPACE_KEY, "")) if isinstance(scope, dict) else ""


# -- serving ----------------------------------------------------------------------------------------------
async def serve_http(app: MCPServer[Any], options: HttpOptions, departure: Departure | None = None) -> None:
    """Serve ``app`` over streamable HTTP behind :class:`HttpGuard` until SIGTERM/SIGINT
    (``departure`` is announced first)."""
    import uvicorn

    # Our guard checks Host and Origin for every request first; the SDK's own check would need
    # the same list in its own pattern syntax, so it is switched off rather than kept in two forms.
    starlette_app = app.streamable_http_app(
        host=options.host, transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    config = uvicorn.Config(
        HttpGuard(starlette_app, options.hosts, options.tokens),
        host=options.host,
        port=options.port,
        log_level="warning",
        ssl_certfile=str(options.tls_cert) if options.tls_cert else None,
        ssl_keyfile=str(options.tls_key) if options.tls_key else None,
    )
    server = _server_class()(config)
    scheme = "https" if options.tls_cert else "http"
    auth = "bearer tokens: " + ", ".join(options.tokens.namespaces) if options.tokens else "NO authentication"
    log.warning("serving MCP on %s://%s:%d/mcp (%s)", scheme, options.host, options.port, auth)
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            # The receiver stays open until the very end: a second signal while the sessions close
            # must not meet the default handler (which would kill us before the sandboxes are gone).
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    if not server.should_exit:
                        log.warning("received %s; the bridge stops", signal.Signals(signum).name)
                        if departure is not None:
                            departure.announce()
                    server.should_exit = True

        tg.start_soon(on_signal)
        await server.serve()
        tg.cancel_scope.cancel()


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its signal handlers: it replaces the process's handlers and re-raises
        the signal after shutting down, which would kill us with SIGTERM's default action once
        the sessions are closed; :func:`serve_http` handles the signals instead (as stdio does)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server
