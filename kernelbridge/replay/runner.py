"""A notebook's code cells run through a session registry, as ``run_python`` calls would, each judged.

Two callers: ``kernelbridge replay`` (:func:`replay_notebook`, a registry of its own in a fresh
sandbox) and the MCP server's restore (:func:`replay_cells` into the bridge's registry). A cell that
fails does not stop the replay. Each cell gets its recorded timeout (at most the maximum) or the
default one, never the maximum; a restore's cells left when its budget runs out are ``skipped``.

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import secrets
import shutil
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nbformat

from kernelbridge.config import Settings
from kernelbridge.errors import HubError, SessionError
from kernelbridge.notebook.access import Lacking, SandboxAccess
from kernelbridge.notebook.convert import (
    notebook_access,
    notebook_outputs,
    read_notebook,
    unknown_outputs,
    valid_cell,
    write_notebook_file,
)
from kernelbridge.notebook.displays import journal_entries
from kernelbridge.notebook.journal import JournalCell
from kernelbridge.packages import PackageService, WithPackages
from kernelbridge.packages.record import records_of
from kernelbridge.replay.judge import (
    Behaviour,
    CellVerdict,
    FailedNames,
    ReplayReport,
    behaviour,
    judge,
    lacking_notes,
    ran_in_original,
    skipped_empty,
    skipped_out_of_time,
    skipped_refused,
    skipped_unrecorded,
    unexecuted,
    with_hint,
)
from kernelbridge.replay.recorded import cell_meta
from kernelbridge.replay.tools import ReplayTools, live_settings
from kernelbridge.runtime import RuntimeBackend
from kernelbridge.session.registry import SessionRegistry
from kernelbridge.session.store import SessionStore

RAISES_TAG = "raises-exception"
"""The cell tag with which nbclient (and so ``nbconvert --execute``) lets a cell raise."""
UNLIMITED_NOTE = (
    "this host's container runtime ignores memory and process limits (allowed by"
    " KERNELBRIDGE_ALLOW_UNLIMITED): the replay's sandbox ran without them"
)


def cell_timeout(cell: Any, default: float, maximum: float) -> float:
    """The timeout a cell was run with (recorded by the journal), at most ``maximum``; a cell that
    timed out before the journal recorded timeouts gets its recorded duration; others ``default``."""
    meta = cell_meta(cell)
    timeout = meta.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return min(float(timeout), maximum)
    duration = meta.get("duration_ms")
    if meta.get("status") == "timeout" and isinstance(duration, int) and duration > 0:
        return max(1.0, min(duration // 1000, maximum))
    return min(default, maximum)


def _servers(cell: Any) -> list[str]:
    servers = cell_meta(cell).get("servers")
    return [s for s in servers if isinstance(s, str)][:64] if isinstance(servers, list) else []


async def replay_cells(
    registry: SessionRegistry,
    session: str,
    nb: nbformat.NotebookNode,
    *,
    recorded: ReplayTools | None = None,
    budget: float | None = None,
    packages: PackageService | None = None,
    originals: dict[int, Behaviour] | None = None,
) -> ReplayReport:
    """Run every code cell of ``nb`` in ``session`` of ``registry``, judge it, and put the new
    outputs (and the verdict, in ``metadata.kernelbridge.replay``) into ``nb``.

    Each cell runs for its recorded timeout (at most the registry's ``max_timeout``) or its
    ``default_timeout``;
    with a ``budget`` (seconds), all of them together for at most that (plus the grace of one
    cell's timeout), and the cells left after it are skipped. Raises SandboxError/ImageError when
    no sandbox can be started; everything about a single cell (it raised, a server is not
    configured here) is a verdict, not an exception. ``originals``, if given, is filled with the
    original behaviour of every cell that ran (by its number), for :func:`judge_final_displays`.

    ``packages``: the package service behind the registry's rpc handler; the ``%pip install``s
    recorded in the cells' metadata are handed to it for the replay, so that the same requirements
    install the same wheels again (from the host's cache when they are there).
    """
    original = notebook_access(nb)
    lacking = original.lacks(SandboxAccess.of(registry.settings)) if original is not None else Lacking()
    report = ReplayReport(where=f"session {session!r}", notes=[*lacking_notes(lacking), *unknown_outputs(nb)])
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    namespace = registry.settings.namespace
    if packages is not None:
        installs = [record for cell in code_cells for record in records_of(cell_meta(cell).get("packages"))]
        packages.prefer(namespace, session, installs)
    try:
        run = _Run(registry, session, recorded, FailedNames(), lacking, originals)
        await _replay_all(run, code_cells, report, budget)
    finally:
        if packages is not None:  # later installs of the session resolve afresh
            packages.prefer(namespace, session, [])
    return report


@dataclass(slots=True)
class _Run:
    """What every cell of one replay shares."""

    registry: SessionRegistry
    session: str
    recorded: ReplayTools | None
    failed: FailedNames
    lacking: Lacking
    """What the original's sandboxes had and this replay's lack (said up front, and as a hint)."""
    originals: dict[int, Behaviour] | None = None


async def _replay_all(run: _Run, code_cells: list[Any], report: ReplayReport, budget: float | None) -> None:
    settings = run.registry.settings
    started = time.monotonic()
    for index, cell in enumerate(code_cells, 1):
        timeout = cell_timeout(cell, settings.default_timeout, settings.max_timeout)
        left = None if budget is None else budget - (time.monotonic() - started)
        if left is not None and left < 1:
            verdict = skipped_out_of_time(index, budget or 0)
        else:
            timeout = timeout if left is None else max(1.0, min(timeout, left))
            verdict = await _replay_one(run, index, cell, timeout)
        meta = cell.metadata.setdefault("kernelbridge", {})
        if isinstance(meta, dict):
            meta["replay"] = {"verdict": verdict.verdict, "why": verdict.why}
        report.cells.append(verdict)


async def _replay_one(run: _Run, index: int, cell: Any, timeout: float) -> CellVerdict:
    if not cell.source.strip():
        return skipped_empty(index)
    if run.recorded is not None:
        if (servers := run.recorded.unrecorded(cell)) is not None:
            return skipped_unrecorded(index, servers)
        run.recorded.begin(cell)
    meta = cell_meta(cell)
    ran = ran_in_original(cell.outputs, cell.get("execution_count"), meta)
    original = behaviour(cell.outputs, meta.get("status"))
    try:
        result = await run.registry.run(run.session, cell.source, timeout=timeout, servers=_servers(cell))
    except (HubError, SessionError) as exc:
        return skipped_refused(index, str(exc))
    if run.originals is not None:
        run.originals[index] = original
    cell.outputs = notebook_outputs(result.outputs, result.execution_count)
    cell.execution_count = result.execution_count
    valid_cell(cell)
    now = behaviour(result.outputs, result.status)
    verdict = judge(index, original, now)
    if not ran and verdict.verdict != "same":
        verdict = unexecuted(index, now, may_raise=RAISES_TAG in _tags(cell))
    verdict = run.failed.cause(with_hint(verdict, now, run.lacking), now)
    if now.raised is not None and (verdict.verdict == "error" or not ran):
        run.failed.failed(verdict, cell.source)  # what it would have bound is missing from now on
    return verdict


def _tags(cell: Any) -> list[str]:
    tags = cell.metadata.get("tags")
    return [tag for tag in tags if isinstance(tag, str)] if isinstance(tags, list) else []


def judge_final_displays(
    report: ReplayReport, nb: nbformat.NotebookNode, originals: dict[int, Behaviour], journal: Path
) -> None:
    """Judge again, by what they show at the end, the cells whose outputs a later cell updated.

    A notebook saved by nbclient shows in ``display(x, display_id=...)``'s cell the data of the
    id's last update, made by a later cell; right after the replayed cell ran, it showed the first
    value. So a cell that was ``different`` and carries display ids is judged once more on its
    outputs as the replay session's journal has them at the end (display updates applied, as its
    export would), and those outputs go into the replayed notebook. Cells are matched to the
    journal's in order (each cell that ran is one line); if the counts disagree nothing changes.
    """
    try:
        cells = [entry for entry in journal_entries(journal) if isinstance(entry, JournalCell)]
    except OSError:
        return
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    ran = sorted(originals)
    if len(cells) != len(ran):
        return
    for index, entry in zip(ran, cells, strict=True):
        position = index - 1
        if report.cells[position].verdict != "different" or not entry.display_ids:
            continue
        again = judge(index, originals[index], behaviour(entry.outputs, entry.status))
        if again.verdict == "same":
            report.cells[position] = again
            code_cells[position].outputs = notebook_outputs(entry.outputs, entry.execution_count)
            meta = code_cells[position].metadata.get("kernelbridge")
            if isinstance(meta, dict):  # a notebook from anywhere: its metadata may be anything
                meta["replay"] = {"verdict": "same", "why": ""}


async def replay_notebook(
    settings: Settings,
    path: str | Path,
    output: str | Path | None = None,
    *,
    grant: tuple[str, ...] = (),
    runtime: RuntimeBackend | None = None,
) -> ReplayReport:
    """``kernelbridge replay``: run ``path`` in a fresh sandbox and judge every cell; write the
    replayed notebook to ``output``. Host tool calls are answered from the notebook's recording,
    except calls to the servers in ``grant``, which are called live (the person named them); the
    saved tools are never written. Before any sandbox, the checks ``serve`` makes (limits
    enforced or ``KERNELBRIDGE_ALLOW_UNLIMITED``, a kernelbridge image). ``runtime`` is a test
    seam (default: the configured engine; an injected one has no images to check).

    Raises ConfigError for a file that is not a notebook, HubError for a ``grant`` that names no
    configured server, LimitsNotEnforced, ImageError or RuntimeUnavailable (one line each) when no
    sandbox may start."""
    from kernelbridge.host.policy import expected_image, preflight
    from kernelbridge.hub import Hub
    from kernelbridge.runtime import open_runtime

    nb = read_notebook(path)
    settings = replace(settings, warm_pool=0)
    session = f"replay-{secrets.token_hex(4)}"
    notes: list[str] = []
    try:
        async with AsyncExitStack() as stack:
            hub: Hub | None = None
            live: list[str] = []
            if grant:  # a hub that sees the named servers only
                hub_settings, live = live_settings(settings, grant)
                hub = await stack.enter_async_context(Hub(hub_settings))
            handler = ReplayTools((c for c in nb.cells if c.cell_type == "code"), settings, hub, live)
            packages = PackageService(settings)  # %pip cells install the recorded wheels again
            if runtime is None:
                runtime = await stack.enter_async_context(open_runtime(settings))
                image, agent_hash = expected_image(settings)
            else:
                image, agent_hash = settings.image or "test-double", None
            _, unlimited = await preflight(settings, runtime, image, agent_hash)  # as `serve` does
            if unlimited:
                notes.append(UNLIMITED_NOTE)
            registry = await stack.enter_async_context(
                SessionRegistry(
                    settings,
                    runtime,
                    image=image,
                    agent_hash=agent_hash,
                    dispatch=WithPackages(packages, handler),
                    check_grants=handler.validate_grants,
                )
            )
            originals: dict[int, Behaviour] = {}
            report = await replay_cells(
                registry, session, nb, recorded=handler, packages=packages, originals=originals
            )
            report.notes[:0] = notes
            await registry.close(session)  # its journal complete: the last display updates written
            try:
                journal = SessionStore.of(settings).journal(session)
            except SessionError:
                journal = None  # nothing journalled (no cell ran): nothing to judge again
            if journal is not None:
                judge_final_displays(report, nb, originals, journal)
    finally:
        # The replayed notebook (-o) is this run's record; the scratch session's is not (removed
        # once its registry closed: its record's last write is done).
        shutil.rmtree(SessionStore.of(settings).session_dir(session), ignore_errors=True)
    report.where = "a fresh sandbox"
    if handler.live:
        report.where += f" (host tools: {', '.join(handler.live)} live, others recorded)"
    elif handler.recording.servers:
        report.where += " (host tools answered from the recording)"
    if output is not None:
        write_notebook_file(nb, output)
    return report
