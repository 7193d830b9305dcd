"""Notebook exports requested by a model: what may be read, where a file may be written, and
what the model is told.

The notebook never enters the model's context: it gets a summary and the resource's URI (the
resource: at most ``notebook_export.MAX_INLINE_CHARS``). ``export_notebook(path=...)`` writes only
below ``<state_dir>/exports`` (or ``KERNELBRIDGE_EXPORT_DIR``): a relative ``.ipynb`` path without
``..`` or empty components, no symlink followed below the directory (each component opened
``O_NOFOLLOW`` from its parent's descriptor), a fresh 0600 file flushed and renamed over the target,
never written through. The journal is read in a worker process, one per namespace at a time
(:class:`ExportLimiters`). Design: docs/design/server.md.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, TextIO, TypeVar

import anyio
import anyio.to_process
from anyio import BrokenWorkerProcess
from mcp.server.mcpserver.exceptions import ToolError

from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.notebook.export import (
    NotebookFacts,
    export_to_path,
    notebook_facts,
    notebook_text,
    run_niced,
)
from kernelbridge.notebook.journal import journal_read_limit
from kernelbridge.session.generations import journal_of as generation_journal
from kernelbridge.session.generations import parse_ref
from kernelbridge.session.store import FULL, MAX_COUNTED_FILES, SessionStore, disk_use

MAX_EXPORT_PATH = 512
"""Characters of a requested export path; longer is a mistake or an attack."""
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
T = TypeVar("T")


class ExportLimiters:
    """One worker process at a time per namespace for reading journals (exports, the notebook and
    outputs resources, restores): a tenant's queue behind each other, never behind another's."""

    def __init__(self) -> None:
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    def of(self, namespace: str) -> anyio.CapacityLimiter:
        limiter = self._limiters.get(namespace)
        if limiter is None:
            limiter = self._limiters[namespace] = anyio.CapacityLimiter(1)
        return limiter


async def in_worker(limiter: anyio.CapacityLimiter, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a worker process of ``limiter`` (killed if the caller is cancelled);
    KernelBridgeError and OSError become one-line ToolErrors (without host paths)."""
    try:
        return await anyio.to_process.run_sync(run_niced, func, *args, cancellable=True, limiter=limiter)
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ToolError(f"the session's journal could not be read: {why}") from None
    except BrokenWorkerProcess:
        raise ToolError("the worker reading the journal failed (see the bridge's log); try again") from None


async def journal_of(settings: Settings, session: str) -> Path:
    """The journal of ``session``'s current generation (``NAME@N``: of generation N), in the
    caller's namespace only. Raises ToolError (it has none)."""
    try:
        return await anyio.to_thread.run_sync(generation_journal, SessionStore.of(settings), session)
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None


def notebook_uri(session: str) -> str:
    """The resource that serves ``session``'s notebook (``NAME`` or ``NAME@N``)."""
    return f"kernelbridge://sessions/{session}/notebook"


async def notebook_for_resource(settings: Settings, session: str, limiter: anyio.CapacityLimiter) -> str:
    """``session``'s notebook as text, bounded (see the module docstring). Raises ToolError."""
    journal = await journal_of(settings, session)
    work = partial(notebook_text, journal, parse_ref(session)[0], max_bytes=journal_read_limit(settings))
    return await in_worker(limiter, work)


async def notebook_summary(settings: Settings, session: str, limiter: anyio.CapacityLimiter) -> NotebookFacts:
    """What ``session``'s notebook holds and weighs, never the notebook. Raises ToolError."""
    journal = await journal_of(settings, session)
    work = partial(notebook_facts, journal, parse_ref(session)[0], max_bytes=journal_read_limit(settings))
    return await in_worker(limiter, work)


def export_root(settings: Settings) -> Path:
    """The one directory a model's exports may go to."""
    return settings.export_dir or settings.state_dir / "exports"


def export_parts(root: Path, path: str) -> list[str]:
    """The components of ``path`` below ``root``. Raises ToolError saying why a path is refused."""
    given: object = path  # from a model: checked whatever the annotation says
    if not isinstance(given, str) or not path or len(path) > MAX_EXPORT_PATH or "\0" in path:
        raise ToolError("path must be a relative file name ending in .ipynb, e.g. 'analysis.ipynb'")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        # An absolute path is fine only when it already names a place inside the export root.
        try:
            pure = pure.relative_to(PurePosixPath(root))
        except ValueError:
            raise ToolError(
                f"path {path!r} is outside the export directory; give a relative name such as "
                "'analysis.ipynb' (notebooks are written under the bridge's export directory)"
            ) from None
    parts = list(pure.parts)  # "." and empty components are gone; ".." stays and is refused
    if not parts or ".." in parts:
        raise ToolError(f"path {path!r} may not contain '..'")
    if pure.suffix != ".ipynb" or parts[-1].startswith("."):
        raise ToolError(f"path must end in .ipynb, got {path!r}")
    return parts


async def check_quota(settings: Settings, session: str) -> None:
    """Refuse an export that could take an HTTP token past its disk quota (its files, plus a
    notebook about the size of the journal). Raises ToolError."""
    if settings.disk_quota is None:
        return
    used = await anyio.to_thread.run_sync(disk_use, settings)
    try:
        size = (await journal_of(settings, session)).stat().st_size
    except (ToolError, OSError):
        return  # no journal: the export says so
    if used + size > settings.disk_quota:
        quota = settings.disk_quota / 2**20
        taken = f"more than {MAX_COUNTED_FILES:,} files" if used >= FULL else f"{used / 2**20:.0f} MiB"
        raise ToolError(
            f"this client's files on the host take {taken} of its {quota:.0f} MiB quota "
            "(KERNELBRIDGE_HTTP_DISK_QUOTA, set by the bridge's operator) and this export would not fit; "
            f"the notebook resource {notebook_uri(session)} serves it instead"
        )


def write_confined(root: Path, parts: list[str], write: Callable[[TextIO], object]) -> Path:
    """Write a file ``root/parts...`` with ``write(file)``, without following any symlink below
    ``root``; the file appears whole or not at all. Returns its path.

    Raises ToolError (a component is a symlink or not a directory) or OSError (no space, ...).
    """
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(root, DIR_FLAGS & ~os.O_NOFOLLOW)  # the root itself is the operator's choice
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, or a file
                    raise ToolError(f"{part!r} in the export path is not a directory") from None
                raise
            os.close(fd)
            fd = child
        _replace_whole(fd, parts[-1], write)
    finally:
        os.close(fd)
    return root.joinpath(*parts)


def _replace_whole(dir_fd: int, name: str, write: Callable[[TextIO], object]) -> None:
    """Make ``name`` in ``dir_fd`` the file ``write`` writes: written, flushed to disk, then renamed
    over whatever was there. Nothing named is left if this process dies on the way, except in the
    instant between the temporary name's link and the rename (or always, on a file system without
    ``O_TMPFILE``: a hidden ``.<name>.<random>.tmp``, then)."""
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    out = _unnamed_file(dir_fd)
    named = out is None
    if out is None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(out, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            if not named:  # the complete file gets its temporary name, from its descriptor
                os.link(f"/proc/self/fd/{f.fileno()}", tmp, dst_dir_fd=dir_fd, follow_symlinks=True)
                named = True
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if named:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # the rename on disk too; the file is in place either way
        os.fsync(dir_fd)


def _unnamed_file(dir_fd: int) -> int | None:
    """A new 0600 file in ``dir_fd`` that has no name (``O_TMPFILE``), or None where the file system
    or the kernel cannot make one."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):  # naming it later needs /proc
        return None
    try:
        return os.open(".", os.O_WRONLY | flag | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None
        raise


def _sweep_scratch(scratch: Path) -> None:
    """Remove the scratch files of bridges that died mid-export (their names start with the pid)."""
    from kernelbridge.runtime.reaper import pid_alive  # the reaper's test of a bridge's pid

    for leftover in scratch.glob("*-*.ipynb"):
        pid = leftover.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            leftover.unlink(missing_ok=True)


async def export_to_file(
    settings: Settings, session: str, path: str, limiter: anyio.CapacityLimiter
) -> tuple[NotebookFacts, Path]:
    """Write ``session``'s notebook under the export root (see the module docstring); what it holds
    and where it went. Raises ToolError with a one-line reason."""
    root = export_root(settings)
    parts = export_parts(root, path)
    await check_quota(settings, session)
    journal = await journal_of(settings, session)
    scratch = settings.run_dir / "exports"
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    await anyio.to_thread.run_sync(_sweep_scratch, scratch)
    made = scratch / f"{os.getpid()}-{secrets.token_hex(8)}.ipynb"
    try:
        limit = journal_read_limit(settings)
        facts = await in_worker(
            limiter, partial(export_to_path, journal, parse_ref(session)[0], made, max_bytes=limit)
        )

        def copy(out: TextIO) -> None:
            with open(made, "rb") as written:
                out.flush()
                shutil.copyfileobj(written, out.buffer, 1 << 20)

        written = await anyio.to_thread.run_sync(write_confined, root, parts, copy)
    except IsADirectoryError:
        raise ToolError(f"{path!r} is a directory") from None
    except OSError as exc:
        raise ToolError(f"the notebook could not be written: {exc.strerror or exc}") from None
    finally:
        made.unlink(missing_ok=True)
    return facts, written
