"""Display updates across cells: what each output with a display id shows at the end of a journal.

In Jupyter, ``display(obj, display_id=True)`` in one cell and ``handle.update(new)`` in a later one
change the *earlier* cell's output (nbclient's ``_update_display_id`` updates every output with
that id in the whole notebook; so does a new ``display_data`` with the same id). The journal is
append-only: the earlier cell's line is never rewritten. Instead each cell line says which of its
outputs carry which display id (``display_ids``), and an update that reaches cells already
journalled is a ``display`` record of its own (:class:`~kernelbridge.notebook.journal.JournalDisplay`).

The rule that makes this cheap: every output with display id ``D`` ends up showing the data of the
*last* display event of ``D`` in the journal (a ``display`` record, or an output with ``D`` in a
later cell, which was itself updated by every event until its cell ended). So a notebook is made
in two passes (:class:`FinalDisplays`): the first notes, per display id, where its last event is
(a byte offset, not the data: memory stays small whatever the journal holds); the second, writing
the cells one at a time, gives each output with an id the data of that last event, read back from
the journal when it lies further on.

An update whose id no cell of the journal shows (the cell that showed it was lost, or the line was
edited by hand) changes nothing and is said in one line; so is a journal with more display ids
than :data:`MAX_DISPLAY_IDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelbridge.notebook.journal import (
    JournalCell,
    JournalDisplay,
    JournalEntry,
    JournalReader,
    entries_mentioning,
    read_entry_at,
)

log = logging.getLogger(__name__)

MAX_DISPLAY_IDS = 100_000
"""Display ids followed in one journal (each costs the first pass ~100 bytes); past this many,
further ids keep what their cells recorded."""

Fetch = Callable[[int], JournalEntry | None]
"""The entry at a position of the journal (a byte offset of a file, an index of a list)."""


@dataclass(slots=True)
class _Last:
    position: int
    index: int | None
    """The output's index in the cell at ``position``; None: a ``display`` record."""


@dataclass(slots=True)
class FinalDisplays:
    """Where the last event of each display id of a journal is, and applying it (module docstring)."""

    last: dict[str, _Last] = field(default_factory=dict)
    shown: set[str] = field(default_factory=set)
    """Display ids some cell of the journal shows."""
    orphans: int = 0
    """``display`` records of ids no earlier cell shows."""
    untracked: int = 0
    _cache: tuple[int, JournalEntry | None] | None = None

    def see(self, position: int, entry: JournalEntry) -> None:
        """The first pass: note ``entry`` (at ``position``; positions grow along the journal)."""
        if isinstance(entry, JournalDisplay):
            if entry.display_id not in self.shown:
                self.orphans += 1
                return
            self._note(entry.display_id, _Last(position, None))
        elif isinstance(entry, JournalCell):
            for display_id, indexes in entry.display_ids.items():
                if display_id in self.shown or self._room():
                    self.shown.add(display_id)
                    self._note(display_id, _Last(position, indexes[-1]))

    def seen(self, name: str) -> None:
        """The first pass is over: say, in one line each, what could not be applied."""
        if self.orphans:
            log.warning(
                "journal %s: %d display update(s) for ids that no earlier cell shows were ignored",
                name,
                self.orphans,
            )
        if self.untracked:
            log.warning(
                "journal %s: over %d display ids; %d later ones keep what their cells recorded",
                name,
                MAX_DISPLAY_IDS,
                self.untracked,
            )

    def _room(self) -> bool:
        if len(self.shown) < MAX_DISPLAY_IDS:
            return True
        self.untracked += 1
        return False

    def _note(self, display_id: str, last: _Last) -> None:
        if display_id in self.last or len(self.last) < MAX_DISPLAY_IDS:
            self.last[display_id] = last

    def apply(self, position: int, entry: JournalEntry, fetch: Fetch) -> None:
        """The second pass: give the outputs with a display id of the cell ``entry`` (at
        ``position``) the data of their id's last event, in place."""
        if not isinstance(entry, JournalCell) or not entry.display_ids:
            return
        for display_id, indexes in entry.display_ids.items():
            last = self.last.get(display_id)
            if last is None or last.position <= position:
                continue  # this cell has the last word (or the id is not followed)
            shown = self._data_of(last, display_id, fetch)
            if shown is None:
                continue
            data, metadata = shown
            for index in indexes:
                if index < len(entry.outputs) and entry.outputs[index].get("output_type") in (
                    "display_data",
                    "execute_result",
                ):
                    entry.outputs[index] = {
                        **entry.outputs[index],
                        "data": dict(data),
                        "metadata": dict(metadata),
                    }

    def _data_of(
        self, last: _Last, display_id: str, fetch: Fetch
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if self._cache is None or self._cache[0] != last.position:
            self._cache = (last.position, fetch(last.position))
        entry = self._cache[1]
        if isinstance(entry, JournalDisplay) and entry.display_id == display_id:
            return entry.data, entry.metadata
        if isinstance(entry, JournalCell) and last.index is not None and last.index < len(entry.outputs):
            output = entry.outputs[last.index]
            data, metadata = output.get("data"), output.get("metadata")
            if isinstance(data, dict):
                return data, metadata if isinstance(metadata, dict) else {}
        return None


def journal_entries(path: Path, max_bytes: int | None = None) -> Iterator[JournalEntry]:
    """The entries of the journal at ``path`` (at most ``max_bytes`` of it) with the display
    updates applied, one line in memory at a time: the first pass decodes only the lines that
    mention a display id. Raises OSError (opening the file)."""
    limit = max_bytes if max_bytes is not None else 1 << 62
    displays = FinalDisplays()
    for offset, entry in entries_mentioning(path, b"display_id", limit):
        displays.see(offset, entry)
    displays.seen(path.name)
    for offset, entry in JournalReader(path, max_bytes).with_offsets():
        if displays.last:
            displays.apply(offset, entry, lambda at: read_entry_at(path, at, limit))
        yield entry
