"""Display updates across cells: what each output with a display id shows at the end of a journal.

Every output with display id ``D`` ends up showing the data of the *last* display event of ``D`` in
the journal (a ``display`` record, or an output with ``D`` in a later cell). :class:`FinalDisplays`
finds those events in a first pass, keeping byte offsets, not data, and applies them in a second, as
the cells are written one at a time. An update whose id no cell shows changes nothing and is said in
one line; so is a journal with more display ids than :data:`MAX_DISPLAY_IDS`.

Design: docs/design/sessions.md.
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
