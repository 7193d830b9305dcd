"""Replay a notebook (e.g. an exported session journal) into a fresh sandbox.

nbclient does the cell-by-cell execution; we hand it a SandboxKernelManager, so the notebook
runs under exactly the sandbox a live session gets. Errors do not stop the replay: a journal
records failed cells too, and a reader wants to see where the replay diverges.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError
from kernelbridge.kernel import SandboxKernelManager

CELL_TIMEOUT = 600
"""Seconds per cell, as the MCP server's maximum timeout."""


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    cells: int
    errors: int
    """Cells that raised now."""
    errors_before: int
    """Cells that had raised in the notebook as given."""

    def line(self) -> str:
        return (
            f"replayed {self.cells} code cells in a fresh sandbox: {self.errors} raised "
            f"({self.errors_before} had raised in the original)"
        )


def _error_cells(nb: nbformat.NotebookNode) -> int:
    return sum(
        any(out.get("output_type") == "error" for out in cell.get("outputs", []))
        for cell in nb.cells
        if cell.cell_type == "code"
    )


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read and validate; a file that is not a v4 notebook is a ConfigError with one line."""
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except FileNotFoundError:
        raise ConfigError(f"no such notebook: {path}") from None
    except (OSError, ValueError, nbformat.ValidationError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path} is not a valid notebook: {first}") from None
    return nb


async def replay_notebook(
    settings: Settings, path: str | Path, output: str | Path | None = None
) -> ReplaySummary:
    """Execute every code cell of ``path`` in a new sandbox; write the result to ``output``."""
    nb = read_notebook(Path(path))
    errors_before = _error_cells(nb)
    km = SandboxKernelManager(settings=settings, session_name="replay")
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, allow_errors=True, record_timing=False)
    await client.async_execute()
    if output is not None:
        nbformat.write(nb, str(output))
    return ReplaySummary(
        cells=sum(cell.cell_type == "code" for cell in nb.cells),
        errors=_error_cells(nb),
        errors_before=errors_before,
    )
