"""HTTP to one container engine: a shared connection pool, bounded calls, errors in one line.

One ``httpcore2`` pool per engine, shared by every request of every sandbox; each call is bounded;
connection failures and refusals become ``kernelbridge.errors`` (EngineRefused); a hijacked
connection (``Connection: Upgrade`` -> 101) carries a container's stdio and can half-close. It knows
HTTP, not containers. Why httpcore2: docs/design/runtime.md.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import anyio.abc
import anyio.streams.tls
import httpcore2

from kernelbridge.errors import EngineRefused, RuntimeUnavailable
from kernelbridge.runtime.engine.endpoint import Endpoint, ssl_context

API_VERSION = "v1.41"
"""Docker 20.10 (Debian 12's docker.io) and podman 4.x's compat API both serve 1.41; newer engines
still accept it (docker serves every version back to 1.24)."""
API_TIMEOUT = 30.0
"""Bound of one API call. Engines answer in milliseconds here, but a machine starting twenty
sandboxes at once can stall one for seconds; past this the engine is wedged."""
CONNECT_TIMEOUT = 10.0
"""Bound of opening a connection (a tcp engine across a network, an ssh forward)."""
KEEPALIVE_CONNECTIONS = 8
"""Idle connections kept open per engine: enough for the bursts of a warm pool refilling."""
ERROR_BODY_LIMIT = 4096
"""Bytes of an engine's error body kept for the message."""
HALF_CLOSE = "kernelbridge.send_eof"
"""``get_extra_info`` key under which our network streams offer their half-close."""


def _bounded(timeout: float | None) -> contextlib.AbstractContextManager[object]:
    """``anyio.fail_after(timeout)``, or no scope at all without a timeout: a container's stdio is
    read for as long as it runs and written under its tunnel's own bound (``Tunnel.send_bytes``),
    and a cancel scope per read or write is a cost on every warm call."""
    return contextlib.nullcontext() if timeout is None else anyio.fail_after(timeout)


class HalfClosableStream(httpcore2.AsyncNetworkStream):
    """httpcore's network stream over an anyio stream, plus a half-close of the write side."""

    def __init__(self, stream: anyio.abc.ByteStream, transport: anyio.abc.ByteStream | None = None) -> None:
        self._stream = stream
        self._transport = transport or stream
        """The socket under TLS: half-closing sends a FIN under the TLS session, as docker's own
        client does (Go's TLS has no half-close either); the engine reads it as the end of stdin."""

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            with _bounded(timeout):
                return await self._stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""
        except TimeoutError:
            raise httpcore2.ReadTimeout("the engine sent nothing in time") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise httpcore2.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            with _bounded(timeout):
                await self._stream.send(buffer)
        except TimeoutError:
            raise httpcore2.WriteTimeout("the engine took nothing in time") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise httpcore2.WriteError(str(exc) or type(exc).__name__) from exc

    async def send_eof(self) -> None:
        """Shut down our write side only; data already sent is flushed first (the asyncio
        transport's ``write_eof`` waits for its buffer, unlike a raw ``socket.shutdown``)."""
        await self._transport.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                tls = await anyio.streams.tls.TLSStream.wrap(
                    self._stream, hostname=server_hostname, ssl_context=ssl_context, standard_compatible=False
                )
        except TimeoutError:
            await self.aclose()
            raise httpcore2.ConnectTimeout("TLS handshake timed out") from None
        except (ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            await self.aclose()
            raise httpcore2.ConnectError(f"TLS handshake failed: {exc}") from exc
        return HalfClosableStream(tls, transport=self._stream)

    def get_extra_info(self, info: str) -> Any:
        if info == HALF_CLOSE:
            return self.send_eof
        if info == "ssl_object":
            return self._stream.extra(anyio.streams.tls.TLSAttribute.ssl_object, None)
        if info == "socket":
            return self._stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if info == "is_readable":
            sock = self._stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            return sock is not None and _readable(sock)
        return None


def _readable(sock: Any) -> bool:
    """A pooled idle connection that turned readable was closed by the engine (or sent junk)."""
    import select

    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class EngineNetworkBackend(httpcore2.AsyncNetworkBackend):
    """Opens anyio sockets wrapped as :class:`HalfClosableStream`; ``unix_path`` overrides every
    connection's destination (an ssh forward's local socket)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                return HalfClosableStream(await anyio.connect_tcp(host, port, local_host=local_address))
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"no answer from {host}:{port}") from None
        except OSError as exc:
            raise httpcore2.ConnectError(_os_reason(exc)) from exc

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                return HalfClosableStream(await _connect_unix(path))
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"no answer from {path}") from None
        except OSError as exc:
            raise httpcore2.ConnectError(_os_reason(exc)) from exc

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class _EngineSocket(socket.socket):
    """A unix socket whose ``repr`` asks the kernel nothing. asyncio formats ``repr(sock)`` into
    the KeyError it catches each time a reader is added for the socket (anyio adds one for every
    read that has to wait), and ``socket.__repr__`` makes two system calls: about 10 us per read
    of a container's stdio, several reads per cell."""

    def __repr__(self) -> str:
        return f"<engine socket fd={self.fileno()}>"


async def _connect_unix(path: str) -> anyio.abc.UNIXSocketStream:
    """``anyio.connect_unix(path)``, on an :class:`_EngineSocket`."""
    sock = _EngineSocket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        while True:
            try:
                sock.connect(path)
                break
            except BlockingIOError:  # the listener's backlog is full: wait for room
                await anyio.wait_writable(sock)
        return await anyio.abc.UNIXSocketStream.from_socket(sock)
    except BaseException:
        sock.close()
        raise


def _os_reason(exc: OSError) -> str:
    known = {
        errno.ENOENT: "no such socket",
        errno.ECONNREFUSED: "connection refused",
        errno.EACCES: "permission denied",
        errno.EHOSTUNREACH: "host unreachable",
        errno.ENETUNREACH: "network unreachable",
        errno.ETIMEDOUT: "connection timed out",
    }
    # anyio's connect_tcp tries every address and raises "All connection attempts failed"
    # from the last attempt's error, which has the errno.
    cause: BaseException | None = exc
    while isinstance(cause, OSError):
        if cause.errno in known:
            return known[cause.errno]
        cause = cause.__cause__
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


@dataclass(frozen=True, slots=True)
class EngineResponse:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    """Header names in lower case."""

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else None


Content = bytes | AsyncIterator[bytes] | None


class EngineClient:
    """One engine's HTTP API over one connection pool. Safe to use from many tasks at once."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        engine: str,
        hint: str = "",
        unix_path: str | None = None,
        timeout: float = API_TIMEOUT,
    ) -> None:
        self.endpoint = endpoint
        self.engine = engine
        """``podman`` or ``docker`` (``engine`` until the engine said which), for messages."""
        self.hint = hint
        """What to check when the engine cannot be reached (``is dockerd running?``)."""
        self.timeout = timeout
        uds = unix_path or (endpoint.path if endpoint.scheme == "unix" else None)
        if uds is not None:
            self._base = f"http://localhost/{API_VERSION}"
            self._host = b"localhost"
        else:
            scheme = "https" if endpoint.tls else "http"
            host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
            self._base = f"{scheme}://{host}:{endpoint.port}/{API_VERSION}"
            self._host = f"{host}:{endpoint.port}".encode()
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context(endpoint.tls) if endpoint.tls else None,
            # No cap: every attached sandbox holds one connection for its whole life (a hijacked
            # connection never returns to the pool), so a cap would make sandbox N+1 wait forever.
            max_connections=None,
            max_keepalive_connections=KEEPALIVE_CONNECTIONS,
            keepalive_expiry=30.0,
            uds=uds,
            network_backend=EngineNetworkBackend(),
        )

    def url(self, path: str, query: Mapping[str, object] | None = None) -> str:
        url = self._base + path
        if query:
            pairs: list[tuple[str, str]] = []
            for key, value in query.items():
                values = value if isinstance(value, list | tuple) else [value]
                pairs += [(key, _query_value(v)) for v in values]
            url += "?" + urlencode(pairs, quote_via=quote)
        return url

    def _timeouts(self, timeout: float | None) -> dict[str, float | None]:
        return {"connect": CONNECT_TIMEOUT, "read": timeout, "write": timeout, "pool": timeout}

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        body: object = None,
        content: Content = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        what: str = "",
    ) -> EngineResponse:
        """One API call, bounded by ``timeout`` (default :data:`API_TIMEOUT`) from connect to the
        last body byte. ``body`` is sent as JSON; ``content`` as is.

        Raises EngineRefused (status >= 400), RuntimeUnavailable (unreachable, wedged).
        """
        timeout = self.timeout if timeout is None else timeout
        hdrs = {"Host": self._host.decode(), **(headers or {})}
        if body is not None:
            content = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if isinstance(content, bytes):
            hdrs["Content-Length"] = str(len(content))
        what = what or f"{method} {path}"
        with self._translated(what, timeout):
            response = await self._pool.request(
                method,
                self.url(path, query),
                headers=list(hdrs.items()),
                content=content,
                extensions={"timeout": self._timeouts(timeout)},
            )
        if response.status >= 400:
            raise self._refused(what, response.status, response.content)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
        return EngineResponse(response.status, response.content, headers)

    async def download(self, path: str, target: Path, *, timeout: float, what: str) -> int:
        """GET ``path`` into the file ``target`` as the body arrives (an image archive is too big to
        hold in memory); the bytes written. Bounded by ``timeout`` as :meth:`request` is.

        Raises EngineRefused, RuntimeUnavailable, OSError (the file cannot be written).
        """
        written = 0
        with self._translated(what, timeout):
            async with self._pool.stream(
                "GET",
                self.url(path),
                headers=[("Host", self._host.decode())],
                extensions={"timeout": self._timeouts(timeout)},
            ) as response:
                if response.status >= 400:
                    raise self._refused(what, response.status, await _read_limited(response))
                async with await anyio.open_file(target, "wb") as file:
                    async for chunk in response.aiter_stream():
                        await file.write(chunk)
                        written += len(chunk)
        return written

    async def hijack(
        self,
        path: str,
        query: Mapping[str, object],
        *,
        what: str,
        body: object = None,
        timeout: float | None = None,
    ) -> tuple[httpcore2.Response, httpcore2.AsyncNetworkStream]:
        """POST ``path`` (with ``body`` as JSON, if any) asking to upgrade the connection to a raw
        stream (``Upgrade: tcp``); return the 101 response (close it to drop the connection) and
        the raw stream.

        Raises EngineRefused, RuntimeUnavailable.
        """
        timeout = self.timeout if timeout is None else timeout
        headers = [(b"Host", self._host), (b"Connection", b"Upgrade"), (b"Upgrade", b"tcp")]
        content = b""
        if body is not None:
            content = json.dumps(body).encode()
            headers += [
                (b"Content-Type", b"application/json"),
                (b"Content-Length", str(len(content)).encode()),
            ]
        request = httpcore2.Request(
            "POST",
            self.url(path, query),
            headers=headers,
            content=content,
            extensions={"timeout": self._timeouts(timeout)},
        )
        with self._translated(what, timeout):
            response = await self._pool.handle_async_request(request)
            if response.status != 101:
                try:
                    body = await _read_limited(response)
                finally:
                    await response.aclose()
                raise self._refused(what, response.status, body)
        return response, response.extensions["network_stream"]

    @contextlib.contextmanager
    def _translated(self, what: str, timeout: float) -> Iterator[None]:
        """Bound a call by ``timeout`` and turn transport failures into RuntimeUnavailable."""
        where = f"the {self.engine} engine at {self.endpoint.url}"
        try:
            with anyio.fail_after(timeout):
                yield
        except (TimeoutError, httpcore2.TimeoutException):
            raise RuntimeUnavailable(f"{where} did not answer {what} within {timeout:g} s") from None
        except httpcore2.ConnectError as exc:
            hint = f"; {self.hint}" if self.hint else ""
            raise RuntimeUnavailable(f"cannot reach {where}: {exc}{hint}") from None
        except (httpcore2.NetworkError, httpcore2.ProtocolError) as exc:
            raise RuntimeUnavailable(f"{where} broke off {what}: {str(exc) or type(exc).__name__}") from None

    def _refused(self, what: str, status: int, body: bytes) -> EngineRefused:
        reason = engine_message(body) or f"HTTP {status}"
        return EngineRefused(f"the {self.engine} engine refused {what}: {reason}", status, reason)

    async def aclose(self) -> None:
        await self._pool.aclose()


async def _read_limited(response: httpcore2.Response) -> bytes:
    body = b""
    async for chunk in response.aiter_stream():
        body += chunk
        if len(body) >= ERROR_BODY_LIMIT:
            break
    return body[:ERROR_BODY_LIMIT]


def engine_message(body: bytes) -> str:
    """The one-line ``message`` of an engine's JSON error body (or its text)."""
    text = body[:ERROR_BODY_LIMIT].decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        text = data["message"]
    return " ".join(text.split())[:500]


def _query_value(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
