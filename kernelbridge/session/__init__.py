"""The session layer: named, stateful sandboxes of one bridge, and what they record.

- :mod:`~kernelbridge.session.registry`: :class:`SessionRegistry`, the session map and its limits
  (create, reuse, close, idle reaping, the warm pool's seats), one call at a time per session;
- :mod:`~kernelbridge.session.state`: :class:`SessionState`, a session's life, and its one
  transition function;
- :mod:`~kernelbridge.session.runner`: one cell's run and the timeout policy (deadlines,
  interrupt, grace, restart, discard), on an injected clock;
- :mod:`~kernelbridge.session.store`: :class:`SessionStore`, the on-disk records and journals of a
  namespace, one per generation of a session name;
- :mod:`~kernelbridge.session.recording`: a generation's journal as the session writes it;
- :mod:`~kernelbridge.session.recorder`: every iopub message of a session's kernel -> cells;
- :mod:`~kernelbridge.session.cell`: one cell's bounded outputs, :class:`CellResult`;
- :mod:`~kernelbridge.session.broker`: one session's host MCP calls and their records;
- :mod:`~kernelbridge.session.outcome`: statuses and notes as values (the server words them).

It knows nothing about MCP; everything here runs on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.session.cell import CellResult
    from kernelbridge.session.outcome import Note, State, Status
    from kernelbridge.session.records import SessionRecord
    from kernelbridge.session.registry import Session, SessionRegistry
    from kernelbridge.session.state import SessionState
    from kernelbridge.session.store import SessionStore, validate_session_name

__all__ = [
    "CellResult",
    "Note",
    "Session",
    "SessionRecord",
    "SessionRegistry",
    "SessionState",
    "SessionStore",
    "State",
    "Status",
    "validate_session_name",
]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
