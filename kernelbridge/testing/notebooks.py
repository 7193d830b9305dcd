"""Journals and notebooks whole in memory, for tests: the product streams both (one line, one
cell at a time), and these helpers go through the same code."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import nbformat

from kernelbridge.notebook.displays import FinalDisplays
from kernelbridge.notebook.export import write_notebook
from kernelbridge.notebook.journal import JournalEntry, JournalReader

_nbformat: Any = nbformat  # untyped (as kernelbridge.notebook.convert says)


def read_journal(path: Path, max_bytes: int | None = None) -> list[JournalEntry]:
    """Every entry of a journal file (see :class:`JournalReader`). Raises OSError."""
    return list(JournalReader(path, max_bytes))


def updated_entries(entries: Iterable[JournalEntry]) -> list[JournalEntry]:
    """Entries in memory with the display updates applied, as ``journal_entries`` applies them
    to a journal file."""
    listed = list(entries)
    displays = FinalDisplays()
    for position, entry in enumerate(listed):
        displays.see(position, entry)
    displays.seen("(in memory)")
    for position, entry in enumerate(listed):
        displays.apply(position, entry, lambda at: listed[at])
    return listed


def journal_to_notebook(entries: Iterable[JournalEntry], session: str) -> nbformat.NotebookNode:
    """The notebook an export writes for ``entries`` (display updates applied), read back and
    validated."""
    text = io.StringIO()
    write_notebook(updated_entries(entries), session, text)
    notebook = cast(nbformat.NotebookNode, _nbformat.reads(text.getvalue(), as_version=4))
    _nbformat.validate(notebook)
    return notebook
