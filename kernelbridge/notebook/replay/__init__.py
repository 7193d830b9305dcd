"""Replay a notebook into a fresh sandbox (or a session) and judge every cell against the original.

- :mod:`~kernelbridge.notebook.replay.judge`: normalized outputs, verdicts (``same`` / ``different`` /
  ``error`` / ``skipped``), the report; no I/O;
- :mod:`~kernelbridge.notebook.replay.recorded`: host tool calls answered from the notebook's recording;
- :mod:`~kernelbridge.notebook.replay.tools`: ``kernelbridge replay``'s rpc handler (the recording, live
  servers only when named, the saved tools read only);
- :mod:`~kernelbridge.notebook.replay.runner`: cells through a ``SessionRegistry``, and the CLI's entry.
"""

from kernelbridge.notebook.convert import parse_notebook, read_notebook
from kernelbridge.notebook.replay.judge import (
    CellVerdict,
    ReplayReport,
    Verdict,
    behaviour,
    judge,
    normalize_text,
)
from kernelbridge.notebook.replay.recorded import RecordedTools, recorded_in_full
from kernelbridge.notebook.replay.runner import replay_cells, replay_notebook
from kernelbridge.notebook.replay.tools import ReplayTools

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
