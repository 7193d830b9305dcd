"""The session layer: named, stateful sandboxes of one bridge, and what they record.

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
