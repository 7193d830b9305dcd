"""IPython extension loaded into every sandbox kernel (``--IPKernelApp.extensions``).

IPython 9 copies every byte a cell writes to stdout/stderr into ``history_manager.outputs`` and
keeps it for the life of the kernel (``InteractiveShell._tee``). In a 512 MiB sandbox that turns
printing into a slow leak, and one cell printing a gigabyte into an OOM kill, even though the
output itself is capped (see ``outstream.py``). The host journals every cell's outputs already,
so the kernel keeps none of them.
"""

from __future__ import annotations

from typing import Any


class DiscardedOutputs(dict[int, list[Any]]):
    """A ``history_manager.outputs`` that never holds anything: lookups hand out a fresh list
    (appended to, then garbage), membership is always false."""

    def __contains__(self, key: object) -> bool:
        return False

    def __getitem__(self, key: int) -> list[Any]:
        return []

    def __setitem__(self, key: int, value: list[Any]) -> None:
        pass


def load_ipython_extension(ipython: Any) -> None:
    history = getattr(ipython, "history_manager", None)
    if history is not None and hasattr(history, "outputs"):
        history.outputs = DiscardedOutputs()
