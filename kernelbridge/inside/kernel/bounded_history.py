"""IPython extension loaded into every sandbox kernel (``--IPKernelApp.extensions``).

Two things about IPython's history, whose defaults do not fit a 512 MiB sandbox:

- **Outputs.** IPython 9 copies every byte a cell writes to stdout/stderr into
  ``history_manager.outputs`` and keeps it for the life of the kernel (``InteractiveShell._tee``).
  That turns printing into a slow leak, and one cell printing a gigabyte into an OOM kill, even
  though the output itself is capped (see ``capped_outstream.py``). The host journals every cell's
  outputs already, so the kernel keeps none of them (:class:`DiscardedOutputs`).
- **Inputs.** ``history_request`` (``%history``, a console's up-arrow, jupyter_kernel_test) needs
  the inputs. The agent starts the kernel with the history database in memory
  (``--HistoryManager.hist_file=:memory:``: the root filesystem is read-only and a file would
  outlive nothing anyway) and without output logging. Left alone, IPython keeps every input four
  times (two lists, the database, the ``_i<n>`` variables) for the kernel's life;
  :class:`BoundedHistory` forgets the oldest inputs past :data:`HISTORY_CHARS` characters or
  :data:`HISTORY_CELLS` cells, after each cell.
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
