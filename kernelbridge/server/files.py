"""Files in and out of a session's /workspace, for the MCP client.

Out: resources read through the tunnel by the sandbox's agent, ``.../files`` (the listing, at most
``sandbox.files.MAX_ENTRIES`` entries), ``.../files/{+path}`` (UTF-8 text) and ``.../blobs/{+path}``
(any file, binary). In: ``run_python(files={path: content})``, a ``base64:`` value being binary.
Paths are relative to /workspace; absolute paths, ``..`` and NUL are refused here and again by the
agent, which follows no symlink. Bounded by :data:`MAX_RESOURCE_BYTES` per file read,
:data:`MAX_PLACED_BYTES` and :data:`MAX_PLACED_FILES` per call. Reading needs a live session; it
never starts one.
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from kernelbridge.errors import SandboxError, SandboxFileError
from kernelbridge.server.notes import FilesPlaced
from kernelbridge.session.store import validate_session_name

if TYPE_CHECKING:
    from kernelbridge.host.sandbox import Sandbox
    from kernelbridge.session.registry import SessionRegistry

MAX_RESOURCE_BYTES = 16 * 1024 * 1024
"""Largest file read as a resource: its base64 in one MCP message is ~22 MB."""
MAX_PLACED_BYTES = 16 * 1024 * 1024
"""Bytes of files placed by one call (each also within the agent's 24 MiB per file)."""
MAX_PLACED_FILES = 32
MAX_PATH_CHARS = 1024
BASE64_PREFIX = "base64:"
TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-sh")


def files_uri(session: str, path: str, text: bool) -> str:
    return f"kernelbridge://sessions/{session}/{'files' if text else 'blobs'}/{path}"


def looks_textual(path: str) -> bool:
    """Whether ``path`` is probably text (by its name; the read itself decides)."""
    kind, _ = mimetypes.guess_type(path, strict=False)
    if kind is None:
        return "." not in path.rsplit("/", 1)[-1] or path.endswith((".md", ".csv", ".tsv", ".log", ".ipynb"))
    return kind.startswith("text/") or kind in TEXT_TYPES


def check_path(path: object) -> str:
    """A /workspace-relative path, or ToolError saying why not."""
    if not isinstance(path, str) or not path.strip() or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise ToolError("file paths must be non-empty relative paths inside /workspace")
    if path.startswith("/"):
        raise ToolError(f"{path[:100]!r} is absolute: give paths relative to /workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ToolError(f"{path[:100]!r} leaves /workspace ('..' is not allowed)")
    return "/".join(parts)


def decode_files(files: dict[str, str]) -> list[tuple[str, bytes]]:
    """Check and decode ``run_python``'s ``files`` argument. Raises ToolError."""
    if len(files) > MAX_PLACED_FILES:
        raise ToolError(f"{len(files)} files given; at most {MAX_PLACED_FILES} per call")
    decoded: list[tuple[str, bytes]] = []
    total = 0
    for path, content in files.items():
        clean = check_path(path)
        if content.startswith(BASE64_PREFIX):
            try:
                data = base64.b64decode(content[len(BASE64_PREFIX) :], validate=True)
            except (binascii.Error, ValueError):
                raise ToolError(f"files[{path!r}] starts with 'base64:' but is not valid base64") from None
        else:
            data = content.encode("utf-8", errors="surrogatepass")
        total += len(data)
        if total > MAX_PLACED_BYTES:
            raise ToolError(f"files add up to more than {MAX_PLACED_BYTES:,} bytes; send fewer per call")
        decoded.append((clean, data))
    return decoded


async def place_files(sandbox: Sandbox, files: list[tuple[str, bytes]]) -> FilesPlaced:
    """Write ``files`` into the sandbox's /workspace; returns what was placed (a note). Raises
    ToolError (refused by the agent, or the sandbox failed)."""
    placed: list[tuple[str, int]] = []
    for path, data in files:
        try:
            await sandbox.agent.files("write", path=path, data=base64.b64encode(data).decode("ascii"))
        except SandboxFileError as exc:
            raise ToolError(f"could not place {path!r}: {exc}") from None
        except SandboxError as exc:
            raise ToolError(f"could not place {path!r}: {str(exc).splitlines()[0]}") from None
        placed.append((path, len(data)))
    return FilesPlaced(tuple(placed))


def _live_sandbox(registry: SessionRegistry, session: str) -> Sandbox:
    current = registry.session(session)
    sandbox = current.sandbox if current is not None else None
    if sandbox is None or not sandbox.alive:
        raise ResourceError(f"no live session {session!r}: its files exist only while its sandbox runs")
    return sandbox


async def _read(registry: SessionRegistry, session: str, path: str) -> bytes:
    sandbox = _live_sandbox(registry, session)
    try:
        answer = await sandbox.agent.files("read", path=path)
    except SandboxFileError as exc:
        raise ResourceError(str(exc)) from None
    except SandboxError as exc:
        raise ResourceError(str(exc).splitlines()[0]) from None
    data = base64.b64decode(str((answer or {}).get("data", "")))
    if len(data) > MAX_RESOURCE_BYTES:
        raise ResourceError(
            f"{path} is {len(data):,} bytes; files over {MAX_RESOURCE_BYTES:,} are not served"
        )
    return data


async def list_files(registry: SessionRegistry, session: str) -> str:
    """The listing resource (JSON)."""
    sandbox = _live_sandbox(registry, session)
    try:
        answer: dict[str, Any] = await sandbox.agent.files("list", path=".") or {}
    except SandboxError as exc:
        raise ResourceError(str(exc).splitlines()[0]) from None
    entries = []
    for entry in answer.get("entries") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        item = {k: entry.get(k) for k in ("path", "type", "size", "mtime")}
        if entry.get("type") == "file":
            item["uri"] = files_uri(session, entry["path"], looks_textual(entry["path"]))
        entries.append(item)
    return json.dumps({"session": session, "entries": entries, "truncated": bool(answer.get("truncated"))})


async def read_text(registry: SessionRegistry, session: str, path: str) -> str:
    """A text file; a binary one is an error naming its blob URI."""
    data = await _read(registry, session, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ResourceError(
            f"{path} is not UTF-8 text: read {files_uri(session, path, text=False)}"
        ) from None


async def read_blob(registry: SessionRegistry, session: str, path: str) -> bytes:
    return await _read(registry, session, path)


def register_file_resources(app: MCPServer[Any], registry_of: Callable[[Context], SessionRegistry]) -> None:
    """Add the listing, text and blob resources to ``app`` (an MCPServer);
    ``registry_of(ctx)`` is the session registry of a request."""

    def session_of(session: str) -> str:
        try:
            return validate_session_name(session)
        except Exception as exc:
            raise ResourceError(str(exc)) from None

    @app.resource(
        "kernelbridge://sessions/{session}/files",
        name="session-files",
        description="Files in a live session's /workspace (JSON listing with a URI per file)",
        mime_type="application/json",
    )
    async def files_listing(session: str, ctx: Context) -> str:
        return await list_files(registry_of(ctx), session_of(session))

    @app.resource(
        "kernelbridge://sessions/{session}/files/{+path}",
        name="session-file",
        description="A text file in a live session's /workspace",
        mime_type="text/plain",
    )
    async def file_text(session: str, path: str, ctx: Context) -> str:
        return await read_text(registry_of(ctx), session_of(session), path)

    @app.resource(
        "kernelbridge://sessions/{session}/blobs/{+path}",
        name="session-blob",
        description="Any file in a live session's /workspace, as binary",
        mime_type="application/octet-stream",
    )
    async def file_blob(session: str, path: str, ctx: Context) -> bytes:
        return await read_blob(registry_of(ctx), session_of(session), path)
