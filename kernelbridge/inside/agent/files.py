"""Files in and out of the sandbox's /workspace, done by the agent for the host (``fs_request``).

Paths are relative to /workspace and walked one component at a time with ``O_NOFOLLOW``: a symlink
planted by kernel code (say to ``/proc/1/fd/1``, the frame stream) is refused, never followed. Only
regular files are read or written (a FIFO would block the agent). Operations (``op``):

- ``list`` ``{"path": dir}`` -> ``{"entries": [{"path", "type": "file"|"dir", "size", "mtime"}]}``,
  recursive, at most :data:`MAX_ENTRIES` (``truncated`` says so);
- ``read`` ``{"path": file}`` -> ``{"data": base64, "size"}``, at most :data:`MAX_FILE_BYTES`;
- ``write`` ``{"path": file, "data": base64}`` -> ``{"size"}``; parent directories are created;
- an error -> ``{"kind", "message"}``, kind ``not_found``, ``invalid_path``, ``too_large``,
  ``not_a_file`` or ``io_error``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import stat
from collections.abc import Iterator
from typing import Any

from kernelbridge import frames

MAX_FILE_BYTES = 24 * 1024 * 1024
"""Largest file moved in one frame: its base64 (32 MiB) fits the frame cap with room to spare."""
MAX_ENTRIES = 2000
MAX_PATH_CHARS = 1024
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FsError(Exception):
    """A refused or failed file operation. A plain class, not a frozen dataclass: contextlib sets
    ``__traceback__`` on an exception leaving a ``with`` block, which a frozen dataclass refuses
    (every error raised inside ``_open_dir`` became a TypeError)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.kind = kind
        self.message = message


def respond(root: str, request: frames.Frame) -> frames.Frame:
    """The ``fs_response`` frame answering the ``fs_request`` ``request`` under ``root``. Never
    raises: a refusal or a failure is the answer's ``error``."""
    answer: frames.Frame = {"type": frames.FS_RESPONSE, "id": request.get("id")}
    try:
        answer["result"] = handle(root, request.get("op"), request)
    except FsError as exc:
        answer["error"] = {"kind": exc.kind, "message": exc.message}
    except Exception as exc:  # an agent bug must not end the relay
        answer["error"] = {"kind": "io_error", "message": f"{type(exc).__name__}: {exc}"[:500]}
    return answer


def handle(root: str, op: object, params: dict[str, Any]) -> dict[str, Any]:
    """Run one operation under ``root``; raise FsError with a one-line message on failure."""
    if op == "list":
        return list_dir(root, params.get("path") or ".")
    if op == "read":
        return read_file(root, params.get("path"))
    if op == "write":
        return write_file(root, params.get("path"), params.get("data"))
    raise FsError("invalid_path", f"unknown operation {str(op)[:40]!r}")


def split_path(path: object) -> list[str]:
    """The components of a relative path inside the root; refuses absolute paths and '..'."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise FsError("invalid_path", "the path must be a non-empty relative path")
    if path.startswith("/"):
        raise FsError("invalid_path", f"{path!r} is absolute: paths are relative to /workspace")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise FsError("invalid_path", f"{path!r} leaves /workspace ('..' is not allowed)")
    return parts


@contextlib.contextmanager
def _open_dir(root: str, parts: list[str], create: bool = False) -> Iterator[int]:
    """An fd of the directory ``root/parts``, walked without following any symlink."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    except FileNotFoundError:
        raise FsError("not_found", f"no such directory: {'/'.join(parts) or '.'}") from None
    except OSError as exc:
        raise FsError("invalid_path", f"{'/'.join(parts)}: {_why(exc)}") from None
    finally:
        os.close(fd)


def list_dir(root: str, path: object) -> dict[str, Any]:
    parts = [] if path in (".", "") else split_path(path)
    entries: list[dict[str, Any]] = []
    truncated = False
    with _open_dir(root, parts) as top:
        stack: list[tuple[int, str]] = [(os.dup(top), "/".join(parts))]
        while stack:
            fd, prefix = stack.pop()
            try:
                for name in sorted(os.listdir(fd)):
                    if len(entries) >= MAX_ENTRIES:
                        truncated = True
                        break
                    rel = f"{prefix}/{name}" if prefix else name
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue
                    kind = _kind(info.st_mode)
                    if kind is None:
                        continue  # symlinks, FIFOs, sockets: not files anyone can read out
                    entries.append({"path": rel, "type": kind, "size": info.st_size, "mtime": info.st_mtime})
                    if kind == "dir":
                        with contextlib.suppress(OSError):
                            stack.append((os.open(name, DIR_FLAGS, dir_fd=fd), rel))
            finally:
                os.close(fd)
            if truncated:
                for fd_left, _ in stack:
                    os.close(fd_left)
                break
    return {"entries": entries, "truncated": truncated}


def read_file(root: str, path: object) -> dict[str, Any]:
    *parents, name = split_path(path)
    with _open_dir(root, parents) as dir_fd:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise FsError("not_found", f"no such file: {path}") from None
        except OSError as exc:
            raise FsError("not_a_file", f"{path}: {_why(exc)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FsError("not_a_file", f"{path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise FsError("too_large", f"{path} is {info.st_size:,} bytes; the limit is {MAX_FILE_BYTES:,}")
        data = os.read(fd, MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise FsError("too_large", f"{path} grew past {MAX_FILE_BYTES:,} bytes while being read")
    finally:
        os.close(fd)
    return {"data": base64.b64encode(data).decode("ascii"), "size": len(data)}


def write_file(root: str, path: object, data: object) -> dict[str, Any]:
    *parents, name = split_path(path)
    if not isinstance(data, str):
        raise FsError("invalid_path", "data must be base64 text")
    if len(data) > (MAX_FILE_BYTES * 4) // 3 + 4:
        raise FsError("too_large", f"the file is over the {MAX_FILE_BYTES:,} byte limit")
    try:
        content = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise FsError("invalid_path", "data is not valid base64") from None
    with _open_dir(root, parents, create=True) as dir_fd:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            raise FsError("not_a_file", f"{path}: {_why(exc)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FsError("not_a_file", f"{path} is not a regular file")
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise FsError("io_error", f"{path}: {_why(exc)}") from None
    finally:
        os.close(fd)
    return {"size": len(content)}


def _kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else None


def _why(exc: OSError) -> str:
    if exc.errno == getattr(os, "ELOOP", -1) or "symbolic link" in str(exc).lower():
        return "is a symbolic link (not followed)"
    return exc.strerror or type(exc).__name__
