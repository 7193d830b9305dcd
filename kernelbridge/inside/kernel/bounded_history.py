"""IPython extension loaded into every sandbox kernel (``--IPKernelApp.extensions``): bounded history.

The kernel keeps no cell outputs in its history (:class:`DiscardedOutputs`: the host journals them),
and :class:`BoundedHistory` forgets the oldest inputs past :data:`HISTORY_CHARS` characters or
:data:`HISTORY_CELLS` cells after each cell, so ``history_request`` still works. Expects the agent's
flags: the history database in memory, no output logging. Why: docs/design/sandbox.md.
"""

from __future__ import annotations

import collections
import contextlib
import sqlite3
from typing import Any

HISTORY_CHARS = 4 * 1024 * 1024
"""Characters of input (raw and transformed source) kept for ``history_request``: a few cells of
pasted data must not pin megabytes for the kernel's life, and thousands of typical cells fit."""
HISTORY_CELLS = 1000
"""Inputs kept; a console loads at most its last 1000 for its up-arrow history."""


class DiscardedOutputs(dict[int, list[Any]]):
    """A ``history_manager.outputs`` that never holds anything: lookups hand out a fresh list
    (appended to, then garbage), membership is always false."""

    def __contains__(self, key: object) -> bool:
        return False

    def __getitem__(self, key: int) -> list[Any]:
        return []

    def __setitem__(self, key: int, value: list[Any]) -> None:
        pass


class BoundedHistory:
    """Keeps IPython's input history within bounds (a ``post_run_cell`` hook).

    After each cell: new inputs are counted, the database write cache is flushed (with an
    in-memory database and no saving thread IPython only flushes it when history is read, so it
    grows without end otherwise), and the oldest inputs past the bounds are blanked in the
    in-memory lists (their indices are line numbers: entries are blanked, never removed), their
    ``_i<n>`` variables dropped and their database rows deleted.
    """

    def __init__(self, shell: Any, max_chars: int = HISTORY_CHARS, max_cells: int = HISTORY_CELLS) -> None:
        self.shell = shell
        self.max_chars = max_chars
        self.max_cells = max_cells
        self.kept: collections.deque[tuple[int, int]] = collections.deque()
        """(line number, characters) of every input still kept, oldest first."""
        self.chars = 0
        self.seen = len(shell.history_manager.input_hist_raw)

    def after_cell(self, *_: object) -> None:
        history = self.shell.history_manager
        raw, parsed = history.input_hist_raw, history.input_hist_parsed
        for line in range(self.seen, len(raw)):
            size = len(raw[line]) + (len(parsed[line]) if line < len(parsed) else 0)
            self.kept.append((line, size))
            self.chars += size
        self.seen = len(raw)
        with contextlib.suppress(sqlite3.Error):
            history.writeout_cache()
        last_dropped = None
        # The latest input always stays (a console's up-arrow), whatever its size: it is bounded
        # by what a request may carry.
        while len(self.kept) > 1 and (self.chars > self.max_chars or len(self.kept) > self.max_cells):
            line, size = self.kept.popleft()
            self.chars -= size
            raw[line] = ""
            if line < len(parsed):
                parsed[line] = ""
            self.shell.user_ns.pop(f"_i{line}", None)
            last_dropped = line
        if last_dropped is not None:
            with contextlib.suppress(sqlite3.Error), history.db:
                history.db.execute(
                    "DELETE FROM history WHERE session = ? AND line <= ?",
                    (history.session_number, last_dropped),
                )


def load_ipython_extension(ipython: Any) -> None:
    history = getattr(ipython, "history_manager", None)
    if history is None:
        return
    if hasattr(history, "outputs"):
        history.outputs = DiscardedOutputs()
    if hasattr(history, "input_hist_raw"):
        ipython.events.register("post_run_cell", BoundedHistory(ipython).after_cell)
