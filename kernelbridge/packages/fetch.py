"""Wheels fetched by the host for the sandbox: streamed into a file, bounded in bytes, hashed.

The URLs are the ones the host's pip resolved from the host's index (:mod:`.pip`), never one the
sandbox sent; ``file:`` URLs (the operator's ``--find-links`` directories) are copied the same way.
Each wheel's size is asked first (:func:`declared_size`), then it is streamed (:func:`fetch`) to at
most the caller's ``limit``: an index that declares one size and sends more is cut there. Proxies
and certificates come from the environment as pip would take them (``HTTPS_PROXY``/``NO_PROXY``,
``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``); credentials in pip's own configuration
files or keyring are not used. Why not pip's download: docs/design/packages-and-images.md.
"""

from __future__ import annotations

import enum
import hashlib
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2

BLOCK = 256 * 1024
TIMEOUT = httpx2.Timeout(30.0, read=60.0)
"""Bound on connecting and on each read (the whole download has the caller's bound)."""


class Failure(enum.Enum):
    TOO_LARGE = "too_large"
    """The wheel has (or sent) more bytes than the limit, or than the index said it has."""
    INDEX_DOWN = "index_down"
    FAILED = "failed"


class FetchFailure(Exception):
    """A wheel could not be fetched whole; ``message`` is one line, with no URL in it."""

    def __init__(self, kind: Failure, message: str, *, size: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.size = size
        """TOO_LARGE: the size the index declared, when it did."""


@dataclass(frozen=True, slots=True)
class Fetched:
    size: int
    sha256: str


def open_client(env: Mapping[str, str] | None = None) -> httpx2.AsyncClient:
    """One client for an install's fetches (proxies from the environment, pip's certificates)."""
    source = os.environ if env is None else env
    cafile = source.get("PIP_CERT") or source.get("REQUESTS_CA_BUNDLE")
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cafile) if cafile else True
    return httpx2.AsyncClient(
        verify=verify,
        timeout=TIMEOUT,
        follow_redirects=True,
        headers={"Accept-Encoding": "identity", "User-Agent": "kernelbridge (pip for a sandbox)"},
    )


async def declared_size(client: httpx2.AsyncClient, url: str, *, name: str) -> int | None:
    """The size the index gives for ``url`` (a HEAD's Content-Length; a ``file:`` URL's size), or
    None when it says none. ``name`` is what messages call the wheel. Raises FetchFailure."""
    scheme = _scheme(url, name)
    if scheme == "file":
        try:
            return (await anyio.Path(_local_path(url)).stat()).st_size
        except OSError as exc:
            raise FetchFailure(Failure.FAILED, f"the host could not read {name} ({exc.strerror})") from None
    try:
        response = await client.head(url)
    except httpx2.TransportError as exc:
        raise _unreachable(exc) from None
    if response.status_code in (405, 501):  # no HEAD here: the GET's own length, then the limit
        return None
    _check_status(response, name)
    return _content_length(response)


async def fetch(client: httpx2.AsyncClient, url: str, into: Path, *, limit: int, name: str) -> Fetched:
    """Fetch ``url`` into the file ``into`` (created), never more than ``limit`` bytes. ``name`` is
    what messages call the wheel. Raises FetchFailure (``into`` may then hold part of it: the
    caller's work directory is removed)."""
    if _scheme(url, name) == "file":
        return await anyio.to_thread.run_sync(_copy_local, url, into, limit, name)
    try:
        async with client.stream("GET", url) as response:
            _check_status(response, name)
            length = _content_length(response)
            if length is not None and length > limit:
                raise _too_large(name, length)
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                raise FetchFailure(Failure.FAILED, f"the host's index sent {name} encoded; refused")
            return await _stream(response, into, limit, name)
    except httpx2.TransportError as exc:
        raise _unreachable(exc) from None


def _scheme(url: str, name: str) -> str:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https", "file"):
        raise FetchFailure(Failure.FAILED, f"the host's index gave {name} by a {scheme[:20]!r} URL; refused")
    return scheme


def _local_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def _unreachable(exc: Exception) -> FetchFailure:
    return FetchFailure(
        Failure.INDEX_DOWN, f"the host's package index could not be reached ({type(exc).__name__})"
    )


def _too_large(name: str, size: int | None = None, *, past: int | None = None) -> FetchFailure:
    said = f"is {_mib(size)}" if size is not None else f"is more than {_mib(past or 0)}"
    return FetchFailure(Failure.TOO_LARGE, f"{name}'s wheel {said}", size=size)


def _check_status(response: httpx2.Response, name: str) -> None:
    if response.status_code == 200:
        return
    kind = Failure.INDEX_DOWN if response.status_code >= 500 else Failure.FAILED
    raise FetchFailure(kind, f"the host's index answered {response.status_code} for {name}")


def _content_length(response: httpx2.Response) -> int | None:
    raw = response.headers.get("content-length")
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw)


async def _stream(response: httpx2.Response, into: Path, bound: int, name: str) -> Fetched:
    digest = hashlib.sha256()
    size = 0
    async with await anyio.open_file(into, "wb") as stream:
        async for block in response.aiter_raw(BLOCK):
            size += len(block)
            if size > bound:
                raise _too_large(name, past=bound)
            digest.update(block)
            await stream.write(block)
    return Fetched(size, digest.hexdigest())


def _copy_local(url: str, into: Path, limit: int, name: str) -> Fetched:
    path = _local_path(url)
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as source, into.open("wb") as target:
            declared = os.fstat(source.fileno()).st_size
            if declared > limit:
                raise _too_large(name, declared)
            while block := source.read(BLOCK):
                size += len(block)
                if size > limit:
                    raise _too_large(name, past=limit)
                digest.update(block)
                target.write(block)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise FetchFailure(Failure.FAILED, f"the host could not read {name} ({why})") from None
    return Fetched(size, digest.hexdigest())


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
