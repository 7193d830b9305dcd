"""A package index of the test's own on 127.0.0.1: PEP 691 JSON pages, PEP 658 metadata files (or
none, as an older index), wheels built here, and a count of every byte it serves.

The host's pip resolves against it and kernelbridge fetches from it exactly as from PyPI (the
bridge's ``PIP_INDEX_URL`` names it; see :func:`pip_settings`), so a test can say how many bytes
the host fetched (:attr:`PackageIndex.served`), what it asked for (:attr:`PackageIndex.requests`),
hold a download half-way (:meth:`PackageIndex.hold`), and have the index lie about a size.
Served by uvicorn in the test's own event loop; every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import random
import socket
import zipfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import uvicorn
from packaging.utils import canonicalize_name, parse_wheel_filename
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHUNK = 64 * 1024
WHEEL = b"Wheel-Version: 1.0\nGenerator: kernelbridge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def build_wheel(
    directory: Path, name: str, version: str, *, requires: Iterable[str] = (), payload: int = 0
) -> Path:
    """A real pure-Python wheel of ``name`` (a module of that name, and ``payload`` bytes of
    incompressible data in ``<module>/payload.bin``), with a RECORD that ``installer`` accepts."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {item}\n" for item in requires)
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": WHEEL,
    }
    if payload:
        files[f"{module}/payload.bin"] = random.Random(f"{name}{version}").randbytes(payload)
    record = "".join(f"{path},sha256={_record_hash(data)},{len(data)}\n" for path, data in files.items())
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")
    return path


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_metadata(path: Path) -> bytes:
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name)


@dataclass
class Hold:
    """A download stopped half-way until :attr:`release` is set."""

    paused: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)


class PackageIndex:
    """The index (see the module docstring). ``metadata``: serve PEP 658 metadata files (pip then
    resolves without downloading wheels); ``lie``: file name -> the size the index declares for it
    (its JSON page and HEAD), the body then sent without a length."""

    def __init__(self, wheels: Iterable[Path], *, metadata: bool = True) -> None:
        self.wheels = {path.name: path for path in wheels}
        self.metadata = metadata
        self.lie: dict[str, int] = {}
        self.served: Counter[str] = Counter()
        """Body bytes served per wheel file name (HEAD and pages not counted)."""
        self.requests: list[str] = []
        """``METHOD path?query`` of every request, with its headers, in order."""
        self.on_chunk: Callable[[], None] | None = None
        """Called before each chunk of a wheel is sent (a test samples the host's disk there)."""
        self.on_page: Callable[[], None] | None = None
        """Called when a project page is asked for (the host's pip is running then)."""
        self.rate: int | None = None
        """Bytes per second a wheel's body is sent at (None: as fast as the client takes it). A
        test that counts the bytes a stopped download cost sets it: a client's receive buffer grows
        to tens of MiB on loopback (``tcp_rmem``), and without a pace the index counts as served
        whatever fills it while a busy machine has not yet run the client."""
        self._holds: dict[str, Hold] = {}
        self.url = ""

    def hold(self, filename: str) -> Hold:
        """Stop the next download of ``filename`` half-way until the hold is released."""
        self._holds[filename] = Hold()
        return self._holds[filename]

    def fetched(self, filename: str) -> int:
        return self.served[filename]

    def saw(self, text: str) -> bool:
        """Whether ``text`` appeared in any request the index got (its line or headers)."""
        return any(text in line for line in self.requests)

    # -- the app -----------------------------------------------------------------------------------
    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/simple/{project}/", self._page),
                Route("/files/{filename}", self._file, methods=["GET", "HEAD"]),
            ]
        )

    def _log(self, request: Request) -> None:
        headers = " ".join(f"{k}={v}" for k, v in request.headers.items())
        query = f"?{request.url.query}" if request.url.query else ""
        self.requests.append(f"{request.method} {request.url.path}{query} {headers}")

    async def _page(self, request: Request) -> Response:
        self._log(request)
        if self.on_page is not None:
            self.on_page()
        project = canonicalize_name(request.path_params["project"])
        files = []
        for filename, path in sorted(self.wheels.items()):
            name, _, _, _ = parse_wheel_filename(filename)
            if name != project:
                continue
            entry: dict[str, object] = {
                "filename": filename,
                "url": f"/files/{filename}",
                "hashes": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
                "size": self.lie.get(filename, path.stat().st_size),
            }
            if self.metadata:
                digest = {"sha256": hashlib.sha256(wheel_metadata(path)).hexdigest()}
                entry["core-metadata"] = entry["dist-info-metadata"] = digest
            files.append(entry)
        if not files:
            return Response("not found", status_code=404)
        body = {"meta": {"api-version": "1.1"}, "name": project, "files": files, "versions": []}
        return JSONResponse(body, media_type=JSON_TYPE)

    async def _file(self, request: Request) -> Response:
        self._log(request)
        filename = request.path_params["filename"]
        if filename.endswith(".metadata") and self.metadata and filename[: -len(".metadata")] in self.wheels:
            return Response(wheel_metadata(self.wheels[filename[: -len(".metadata")]]))
        path = self.wheels.get(filename)
        if path is None:
            return Response("not found", status_code=404)
        size = path.stat().st_size
        declared = self.lie.get(filename, size)
        if request.method == "HEAD":
            return Response(b"", headers={"content-length": str(declared)})
        headers = {} if filename in self.lie else {"content-length": str(size)}
        return StreamingResponse(self._body(request, filename, path), headers=headers)

    async def _body(self, request: Request, filename: str, path: Path) -> AsyncIterator[bytes]:
        data = await anyio.Path(path).read_bytes()
        hold = self._holds.pop(filename, None)
        start = anyio.current_time()
        for offset in range(0, len(data), CHUNK):
            if self.rate is not None:
                await anyio.sleep(max(0.0, start + offset / self.rate - anyio.current_time()))
            # uvicorn drops what is sent after the client went away, without waiting: only the
            # bytes sent while it was there count.
            if await request.is_disconnected():
                return
            if hold is not None and offset >= len(data) // 2:
                hold.paused.set()
                await hold.release.wait()
                hold = None
            if self.on_chunk is not None:
                self.on_chunk()
            chunk = data[offset : offset + CHUNK]
            self.served[filename] += len(chunk)
            yield chunk

    # -- running -----------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[PackageIndex]:
        """Serve on a free port of 127.0.0.1 while the block runs."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)  # connections wait in the backlog until uvicorn serves them: no start to wait for
        port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            try:
                yield self
            finally:
                for hold in self._holds.values():
                    hold.release.set()
                server.should_exit = True
        sock.close()


def pip_settings(index: PackageIndex, **more: str) -> dict[str, str]:
    """The variables that make the host's pip use ``index`` and nothing else: no config file of
    this machine (its mirrors and find-links), no extra index."""
    return {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": f"{index.url}/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        **more,
    }


def disk_bytes(directory: Path) -> int:
    """Bytes of every file under ``directory`` now."""
    total = 0
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total
