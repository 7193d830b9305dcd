"""Notebooks from journals in bounded memory, for a worker process off the bridge's interpreter.

Plain functions of paths and numbers that return small values (text of at most
:data:`MAX_INLINE_CHARS`, one image, a notebook without its images' bytes, its
:class:`NotebookFacts`) or write a file; :mod:`kernelbridge.server.exports` runs them with
``anyio.to_process``. A journal is read one line at a time and a notebook written one cell at a
time: the work costs its biggest line a few times over. The text is what ``nbformat.writes`` makes
of the same notebook, except that past :data:`MAX_SPLIT_LINES` a field stays one string.

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import hashlib
import io
import json
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

from kernelbridge.errors import SessionError
from kernelbridge.lazy import skip_unused_imports
from kernelbridge.notebook.convert import access_of, code_cell, entry_cell, new_notebook, strip_images
from kernelbridge.notebook.displays import journal_entries
from kernelbridge.notebook.journal import JournalCell, JournalDisplay, JournalEntry, decode_entry

if TYPE_CHECKING:
    from nbformat import NotebookNode as Node

MAX_INLINE_CHARS = 16 * 1024 * 1024
"""Characters of notebook JSON returned whole (the notebook resource; ``export_notebook`` never
returns it): a bigger one is written to a file instead. Its text may take 4 bytes a character in
memory, and the MCP SDK copies it once more as it sends it."""
MAX_SPLIT_LINES = 100_000
"""Lines a cell's text is split into at most, as nbformat does for diff-friendly files; past it a
field stays one string. Each line is a Python object: 16 M one-character lines would cost 1 GB."""
WORKER_NICE = 10
"""Niceness of the worker process: on a busy machine its CPU goes to the sessions' own processes
first (a tenant's export must not slow another tenant's calls through CPU either)."""
DIGEST_CHARS = 24
PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when its parent dies (linux/prctl.h)."""
T = TypeVar("T")


class TextSink(Protocol):
    """Where :func:`write_notebook` writes: a text file, or a sink that bounds or counts."""

    def write(self, text: str, /) -> int: ...


class NotebookTooLarge(SessionError):
    """A notebook is too big to be returned whole (see :data:`MAX_INLINE_CHARS`)."""


@dataclass(frozen=True, slots=True)
class NotebookFacts:
    """What a notebook is, without it: what ``export_notebook`` tells a model."""

    cells: int
    bytes: int
    """Of its JSON, UTF-8 encoded (a file's size)."""
    chars: int
    """Of its JSON text (what :data:`MAX_INLINE_CHARS` bounds)."""

    @property
    def inline(self) -> bool:
        """Whether it can be returned whole (the notebook resource)."""
        return self.chars <= MAX_INLINE_CHARS


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False)


def write_notebook(entries: Iterable[JournalEntry], session: str, out: TextSink) -> int:
    """Write the notebook of journal ``entries`` to ``out`` one cell at a time (never the whole
    notebook in memory); returns the number of cells. The text is ``nbformat.writes``'s for the
    same notebook (see the module docstring)."""
    empty = '{\n "cells": []'
    out.write('{\n "cells": [')
    cells = 0
    ids: set[str] = set()
    access = None  # the header's (the first line), for the metadata written last
    for entry in entries:
        access = access_of(entry, access)
        cell = entry_cell(entry)
        if cell is None:
            continue
        while cell.id in ids:  # ids are random: unique within the notebook, as nbformat requires
            cell.id = code_cell().id
        ids.add(cell.id)
        _split_lines(cell)
        cell.metadata.pop("trusted", None)
        out.write(("," if cells else "") + "\n  " + _dumps(cell).replace("\n", "\n  "))
        cells += 1
    out.write("\n ]" if cells else "]")
    head = _dumps(new_notebook(session, access))
    assert head.startswith(empty)  # "cells" sorts first
    out.write(head[len(empty) :])
    return cells


def _split_lines(cell: Node) -> None:
    """nbformat's ``split_lines`` for one cell, within :data:`MAX_SPLIT_LINES` in all."""
    budget = MAX_SPLIT_LINES

    def split(text: Any) -> Any:
        nonlocal budget
        if not isinstance(text, str):
            return text
        lines = text.count("\n") + text.count("\r") + 1
        if lines > budget:
            return text
        budget -= lines
        return text.splitlines(True)

    cell["source"] = split(cell.get("source"))
    for output in cell.get("outputs", []):
        if output.get("output_type") in ("execute_result", "display_data"):
            data = output.get("data", {})
            for key, value in list(data.items()):
                if key.startswith("text/") or key in ("application/javascript", "image/svg+xml"):
                    data[key] = split(value)
        elif output.get("output_type") == "stream":
            output["text"] = split(output.get("text"))


class _BoundedText(io.StringIO):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.size = 0

    def write(self, text: str) -> int:
        self.size += len(text)
        if self.size > self.limit:
            raise NotebookTooLarge("too large")
        return super().write(text)


class _Measured(io.TextIOBase):
    """A text sink that counts what it is given, and passes it on to ``into`` (if any)."""

    def __init__(self, into: TextIO | None = None) -> None:
        self.into = into
        self.chars = 0
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.chars += len(text)
        self.bytes += len(text.encode("utf-8", errors="surrogatepass"))
        if self.into is not None:
            self.into.write(text)
        return len(text)

    def facts(self, cells: int) -> NotebookFacts:
        return NotebookFacts(cells, self.bytes, self.chars)


def notebook_facts(journal: Path, session: str, *, max_bytes: int) -> NotebookFacts:
    """The cells and size of ``session``'s notebook, from at most ``max_bytes`` of its ``journal``,
    without holding it (written to a sink that counts). Blocking: run it in a worker. Raises OSError."""
    sink = _Measured()
    return sink.facts(write_notebook(journal_entries(journal, max_bytes), session, sink))


def notebook_text(journal: Path, session: str, *, max_bytes: int, max_chars: int = MAX_INLINE_CHARS) -> str:
    """``session``'s notebook as JSON text, from at most ``max_bytes`` of its ``journal``.
    Blocking: run it in a worker. Raises NotebookTooLarge (over ``max_chars``: write it to a file
    instead), OSError."""
    out = _BoundedText(max_chars)
    try:
        write_notebook(journal_entries(journal, max_bytes), session, out)
    except NotebookTooLarge:
        raise NotebookTooLarge(
            f"the notebook of session {session!r} is over {max_chars / 2**20:g} MiB of JSON, too big to "
            "return whole: export_notebook(session, path='name.ipynb') writes it to a file "
            "(or `kernelbridge export` on the host)"
        ) from None
    return out.getvalue()


def run_niced(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` at :data:`WORKER_NICE`, ending if the bridge does: what a worker process runs
    (never the bridge)."""
    # A worker is a fresh interpreter of kernelbridge's own, not started by its command line: the
    # nbformat it imports would build jsonschema's unused iri grammar first (1.2 CPU-s, most of a
    # bridge's first export).
    skip_unused_imports()
    current = os.nice(0)
    if current < WORKER_NICE:
        os.nice(WORKER_NICE - current)
    _end_with_parent()
    return func(*args)


def _end_with_parent() -> None:
    """SIGKILL this process when its parent (the bridge) dies: an export of a killed bridge would
    otherwise run to its end for nobody, its scratch file left behind."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the worker ends when it next reads from the closed pipe
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was asked for


def digest(data: str) -> str:
    """The name of an image output: a hash of its base64 text."""
    return hashlib.sha256(data.encode("ascii", errors="replace")).hexdigest()[:DIGEST_CHARS]


def find_png(journal: Path, name: str, max_bytes: int) -> bytes | None:
    """The PNG bytes of the image output called ``name`` (``<digest>.png``) in a journal, or None.
    Reads one line at a time, at most ``max_bytes`` of the journal."""
    wanted = name.removesuffix(".png")
    if len(wanted) != DIGEST_CHARS or not all(c in "0123456789abcdef" for c in wanted):
        return None
    read = 0
    try:
        with open(journal, "rb") as lines:
            while read <= max_bytes and (line := lines.readline(max_bytes - read + 1)):
                read += len(line)
                if b'"image/png"' not in line:
                    continue
                for data in _pngs(decode_entry(line)):
                    if digest(data) == wanted:
                        return base64.b64decode(data)
    except (OSError, binascii.Error):
        return None
    return None


def _pngs(entry: object) -> list[str]:
    found: list[str] = []
    if isinstance(entry, JournalDisplay):  # an earlier cell's image, updated
        png = entry.data.get("image/png")
        return [png] if isinstance(png, str) else []
    for output in entry.outputs if isinstance(entry, JournalCell) else []:
        data = output.get("data")
        png = data.get("image/png") if isinstance(data, dict) else None
        if isinstance(png, str):
            found.append(png)
    return found


def export_to_path(journal: Path, session: str, target: Path, *, max_bytes: int) -> NotebookFacts:
    """Write ``session``'s notebook (from its ``journal``) to a new file ``target`` (0600, never an
    existing one, never through a link); returns what it holds. Raises OSError."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        sink = _Measured(out)
        return sink.facts(write_notebook(journal_entries(journal, max_bytes), session, sink))


def restorable_notebook(journal: Path, session: str, *, max_bytes: int) -> Node:
    """``session``'s notebook (from its ``journal``) as a restore needs it: every cell, with its
    images cut to their headers (judging compares a PNG's size, nothing else of an image).
    Raises OSError."""
    cells, access = [], None
    for entry in journal_entries(journal, max_bytes):
        access = access_of(entry, access)
        if (cell := entry_cell(entry)) is not None:
            cells.append(strip_images(cell))
    nb = new_notebook(session, access)
    nb.cells = cells
    return nb
