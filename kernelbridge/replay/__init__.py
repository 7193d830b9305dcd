"""Replay a notebook into a fresh sandbox (or a session) and judge every cell against the original.

- :mod:`~kernelbridge.replay.judge`: normalized outputs, verdicts (``same`` / ``different`` /
  ``error`` / ``skipped``), the report; no I/O;
- :mod:`~kernelbridge.replay.recorded`: host tool calls answered from the notebook's recording;
- :mod:`~kernelbridge.replay.tools`: ``kernelbridge replay``'s rpc handler (the recording, live
  servers only when named, the saved tools read only);
- :mod:`~kernelbridge.replay.runner`: cells through a ``SessionRegistry``, and the CLI's entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports
from kernelbridge.notebook.convert import parse_notebook, read_notebook

# Not lazy: the function has its module's name, and importing the module sets the package's
# attribute ``judge`` to the module; importing the function after it puts it back.
from kernelbridge.replay.judge import judge

if TYPE_CHECKING:
    from kernelbridge.replay.judge import (
        CellVerdict,
        ReplayReport,
        Verdict,
        behaviour,
        normalize_text,
    )
    from kernelbridge.replay.recorded import RecordedTools, recorded_in_full
    from kernelbridge.replay.runner import replay_cells, replay_notebook
    from kernelbridge.replay.tools import ReplayTools

__all__ = [
    "CellVerdict",
    "RecordedTools",
    "ReplayReport",
    "ReplayTools",
    "Verdict",
    "behaviour",
    "judge",
    "normalize_text",
    "parse_notebook",
    "read_notebook",
    "recorded_in_full",
    "replay_cells",
    "replay_notebook",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
