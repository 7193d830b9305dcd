"""Running a notebook's code cells through the bridge's own machinery, judging each one.

Cells run in a session of a :class:`~kernelbridge.sessions.SessionRegistry` (``Sandbox`` and
all), exactly as ``run_python`` calls would: the servers recorded in each cell are granted, host
tool calls go to whatever rpc handler the registry was given (the live hub, or
:class:`~kernelbridge.replay.recorded.RecordedTools`), each cell gets the timeout it was recorded
with, and a cell that fails does not stop the replay: a reader wants to see every divergence.

Two callers: ``kernelbridge replay`` (:func:`replay_notebook`, a registry of its own in a fresh
sandbox) and the MCP server's restore (:func:`replay_cells` into the bridge's registry).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import nbformat

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError, HubError, SessionError
from kernelbridge.hub.rpc import RpcHandler
from kernelbridge.notebook import journal_path, notebook_outputs, valid_cell
from kernelbridge.replay.judge import CellVerdict, ReplayReport, behaviour, judge
from kernelbridge.replay.recorded import RecordedTools, cell_meta, recorded_in_full, tool_calls
from kernelbridge.sessions import SessionRegistry

MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024
"""A notebook bigger than this is not read (a journal's outputs are capped far below it)."""


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Read and validate a v4 notebook. Raises ConfigError with one line (missing file, not JSON,
    not a notebook)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"no such notebook: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if size > MAX_NOTEBOOK_BYTES:
        raise ConfigError(f"{path} is {size:,} bytes; notebooks over {MAX_NOTEBOOK_BYTES:,} are not replayed")
    try:
        return parse_notebook(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def parse_notebook(text: str, name: str) -> nbformat.NotebookNode:
    """Parse and validate notebook JSON. Raises ConfigError naming ``name``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"{name} is not a valid notebook: not JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(data, dict) or "cells" not in data or "nbformat" not in data:
        raise ConfigError(f"{name} is not a valid notebook: no 'cells' and 'nbformat' in it")
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except (ValueError, TypeError, KeyError, nbformat.ValidationError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"{name} is not a valid notebook: {first}") from None
    return nb


def cell_timeout(cell: Any, default: float) -> float:
    """The timeout a cell was run with (recorded by the journal); a cell that timed out before
    the journal recorded timeouts gets its recorded duration; others ``default``."""
    meta = cell_meta(cell)
    timeout = meta.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return min(float(timeout), default)
    duration = meta.get("duration_ms")
    if meta.get("status") == "timeout" and isinstance(duration, int) and duration > 0:
        return max(1.0, min(duration // 1000, default))
    return default


def _servers(cell: Any) -> list[str]:
    servers = cell_meta(cell).get("servers")
    return [s for s in servers if isinstance(s, str)][:64] if isinstance(servers, list) else []


async def replay_cells(
    registry: SessionRegistry,
    session: str,
    nb: nbformat.NotebookNode,
    *,
    default_timeout: float,
    recorded: RecordedTools | None = None,
) -> ReplayReport:
    """Run every code cell of ``nb`` in ``session`` of ``registry``, judge it, and put the new
    outputs (and the verdict, in ``metadata.kernelbridge.replay``) into ``nb``.

    Raises SandboxError/ImageError when no sandbox can be started; everything about a single
    cell (it raised, a server is not configured here) is a verdict, not an exception.
    """
    report = ReplayReport(where=f"session {session!r}")
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    for index, cell in enumerate(code_cells, 1):
        verdict = await _replay_one(registry, session, index, cell, default_timeout, recorded)
        meta = cell.metadata.setdefault("kernelbridge", {})
        if isinstance(meta, dict):
            meta["replay"] = {"verdict": verdict.verdict, "why": verdict.why}
        report.cells.append(verdict)
    return report


async def _replay_one(
    registry: SessionRegistry,
    session: str,
    index: int,
    cell: Any,
    default_timeout: float,
    recorded: RecordedTools | None,
) -> CellVerdict:
    if not cell.source.strip():
        return CellVerdict(index, "skipped", "empty cell")
    if recorded is not None:
        if not recorded_in_full(cell):
            return CellVerdict(index, "skipped", "its host tool calls were not recorded in full")
        recorded.begin(cell)
    original = behaviour(cell.outputs, cell_meta(cell).get("status"))
    try:
        result = await registry.run(
            session, cell.source, timeout=cell_timeout(cell, default_timeout), servers=_servers(cell)
        )
    except (HubError, SessionError) as exc:
        hint = (
            ""
            if recorded is not None or not tool_calls(cell)
            else " (replay --recorded-tools runs it offline)"
        )
        return CellVerdict(index, "skipped", f"{str(exc).splitlines()[0]}{hint}")
    cell.outputs = notebook_outputs(result.outputs, result.execution_count)
    cell.execution_count = result.execution_count
    valid_cell(cell)
    return judge(index, original, behaviour(result.outputs, result.status))


async def replay_notebook(
    settings: Settings,
    path: str | Path,
    output: str | Path | None = None,
    *,
    recorded_tools: bool = False,
) -> ReplayReport:
    """``kernelbridge replay``: run ``path`` in a fresh sandbox and judge every cell; write the
    replayed notebook to ``output``. Raises ConfigError for a file that is not a notebook."""
    from kernelbridge.hub import Hub
    from kernelbridge.kernel.launch import expected_image
    from kernelbridge.runtime import open_runtime

    nb = read_notebook(path)
    settings = replace(settings, warm_pool=0)
    recorded = RecordedTools(c for c in nb.cells if c.cell_type == "code") if recorded_tools else None
    session = f"replay-{secrets.token_hex(4)}"
    async with AsyncExitStack() as stack:
        runtime = await stack.enter_async_context(open_runtime(settings))
        handler: RpcHandler
        if recorded is not None:
            handler, check = recorded, recorded.validate_grants
        else:
            hub = await stack.enter_async_context(Hub(settings))
            handler, check = hub, hub.validate_grants
        image, agent_hash = expected_image(settings)
        registry = await stack.enter_async_context(
            SessionRegistry(
                settings,
                runtime,
                image=image,
                agent_hash=agent_hash,
                dispatch=handler,
                check_grants=check,
            )
        )
        try:
            report = await replay_cells(
                registry, session, nb, default_timeout=settings.max_timeout, recorded=recorded
            )
        finally:
            # The replayed notebook (-o) is this run's record; the scratch session's journal is not.
            journal = journal_path(settings.sessions_dir, session)
            for leftover in (journal, journal.with_name(journal.name + ".prev")):
                with contextlib.suppress(OSError):
                    leftover.unlink()
    report.where = "a fresh sandbox" + (" with recorded tool results" if recorded is not None else "")
    if output is not None:
        nbformat.write(nb, str(output), version=4)
    return report
