"""``run_python(restore=...)``: rebuild a session from a notebook, cell by cell, with the replay's
report (per cell: same / different / error / skipped) as the result.

The notebook is chosen by a model, so only two kinds are read: ``kernelbridge://sessions/<name>/notebook``
(a session's current journal in this state directory, open or closed, of any bridge) or a relative
``.ipynb`` path under ``<state_dir>/exports/`` (absolute paths, ``..`` and symlinks out refused).
The cells run through the bridge's own registry, so the restored session is an ordinary one whose
journal records the rebuild; the whole restore is bounded by the calling ``run_python``'s timeout
(the cells left then are skipped). An open session that has run cells is never overwritten.
Design: docs/design/server.md.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.notebook.convert import read_restorable
from kernelbridge.notebook.export import restorable_notebook
from kernelbridge.notebook.journal import journal_read_limit
from kernelbridge.server.exports import in_worker
from kernelbridge.session.generations import journal_of, parse_ref
from kernelbridge.session.store import SessionStore

if TYPE_CHECKING:  # the replay's modules (nbformat, sessions, sandboxes) load with the first restore
    import nbformat

    from kernelbridge.packages import PackageService
    from kernelbridge.replay import ReplayReport
    from kernelbridge.session.registry import SessionRegistry

_SESSION_NOTEBOOK = re.compile(r"kernelbridge://sessions/([^/]+)/notebook")


class SessionCalls(RpcHandler):
    """The bridge's rpc handler, except for the sessions being rebuilt from their recording."""

    def __init__(self, default: RpcHandler) -> None:
        self._default = default
        self._instead: dict[tuple[str, str], RpcHandler] = {}

    async def dispatch(self, call: RpcCall) -> object:
        return await self._instead.get((call.namespace, call.session), self._default).dispatch(call)

    @contextlib.contextmanager
    def answered_by(self, namespace: str, session: str, handler: RpcHandler) -> Iterator[None]:
        """``session``'s calls go to ``handler`` for the duration of the block."""
        self._instead[(namespace, session)] = handler
        try:
            yield
        finally:
            self._instead.pop((namespace, session), None)


def exports_dir(settings: Settings) -> Path:
    return settings.state_dir / "exports"


async def load_source(
    settings: Settings, notebook: str, reader: anyio.CapacityLimiter
) -> nbformat.NotebookNode:
    """The notebook named by ``notebook`` (see the module docstring), without its images' bytes,
    loaded in a worker process of ``reader`` (the namespace's). Raises ToolError."""
    try:
        if match := _SESSION_NOTEBOOK.fullmatch(notebook):
            name = parse_ref(match[1])[0]  # NAME, or NAME@N for an older generation
            journal = await anyio.to_thread.run_sync(journal_of, SessionStore.of(settings), match[1])
            load = partial(restorable_notebook, journal, name, max_bytes=journal_read_limit(settings))
            return await in_worker(reader, load)
        relative = Path(notebook)
        if relative.is_absolute() or ".." in relative.parts or relative.suffix != ".ipynb":
            raise ToolError(
                "notebook must be kernelbridge://sessions/<name>/notebook or a relative path ending "
                f"in .ipynb under the exports directory (export_notebook writes there): {notebook[:200]!r}"
            )
        root = exports_dir(settings).resolve()
        target = (root / relative).resolve()
        if not target.is_relative_to(root):
            raise ToolError(f"{notebook[:200]!r} leads out of the exports directory")
        return await in_worker(reader, read_restorable, target)
    except (KernelBridgeError, ToolError) as exc:  # from here or from the worker (a ToolError then)
        message = str(exc)
        for path in {str(settings.state_dir.resolve()), str(settings.state_dir)}:
            message = message.replace(path, "<state>")  # no host paths for the model
        raise ToolError(message.splitlines()[0] if message else type(exc).__name__) from None


async def restore_session(
    settings: Settings,
    registry: SessionRegistry,
    session: str,
    notebook: str,
    *,
    budget: float,
    reader: anyio.CapacityLimiter,
    packages: PackageService | None = None,
    recorded: SessionCalls | None = None,
) -> ReplayReport:
    """Run the notebook's code cells into ``session`` within ``budget`` seconds (the calling
    ``run_python``'s timeout); returns the per-cell report. With ``recorded`` (the bridge's
    router), host tool calls are answered from the notebook's recording. Raises ToolError (a bad
    source, an open session, no sandbox)."""
    from kernelbridge.replay import replay_cells
    from kernelbridge.replay.tools import ReplayTools

    current = registry.session(session)
    if current is not None and current.journal is not None and current.journal.cells:
        raise ToolError(
            f"session {session!r} is open and has run {current.journal.cells} cell(s); "
            "close_session it first or restore into a new session name"
        )
    nb = await load_source(settings, notebook, reader)
    started = time.monotonic()
    answers = None
    routed: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if recorded is not None:
        answers = ReplayTools((c for c in nb.cells if c.cell_type == "code"), settings, None, [])
        routed = recorded.answered_by(settings.namespace, session, answers)
    try:
        with routed:
            report = await replay_cells(
                registry, session, nb, recorded=answers, budget=budget, packages=packages
            )
    except KernelBridgeError as exc:
        raise ToolError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
    if answers is not None and answers.recording.servers:
        report.where += " (host tools answered from the recording)"
    report.budget = budget
    report.seconds = time.monotonic() - started
    return report
