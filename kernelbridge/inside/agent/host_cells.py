"""The host's cells the agent relayed and the host may not have heard the end of.

A host that goes away mid-cell (a SIGKILLed bridge) never learns how its cell ended; the next
host (an adoption) must be told, by the agent, because the kernel's own messages cannot be
trusted to say which cells a host really sent (kernel code can publish anything under any parent).
So the agent notes each ``execute_request`` it forwards from a host (its id, the head of its code)
and, from the kernel's ``execute_reply``, how it ended; a cell is forgotten once the host has
acknowledged that reply. Whatever is left when a new host is adopted is that host's inheritance:
the ``cells`` of the ``adopted`` frame.

Bounded: :data:`MAX_CELLS` cells (ipykernel runs one at a time; a host queues a few), each with
at most :data:`MAX_CODE` characters of code.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

MAX_CELLS = 16
MAX_CODE = 16 * 1024


@dataclass(slots=True)
class HostCell:
    msg_id: str
    code: str
    status: str | None = None
    """The execute_reply's status (``ok``, ``error``, ``aborted``); None while it runs."""
    execution_count: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "msg_id": self.msg_id,
            "code": self.code,
            "status": self.status or "running",
            "execution_count": self.execution_count,
        }


class HostCells:
    """See the module docstring."""

    def __init__(self) -> None:
        self._cells: collections.OrderedDict[str, HostCell] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._cells)

    def sent(self, msg: dict[str, Any]) -> None:
        """A host's shell message on its way to the kernel: note it if it is a cell."""
        header, content = msg.get("header"), msg.get("content")
        if not isinstance(header, dict) or header.get("msg_type") != "execute_request":
            return
        msg_id = header.get("msg_id")
        if not isinstance(msg_id, str) or not isinstance(content, dict) or content.get("silent") is True:
            return
        code = content.get("code")
        self._cells[msg_id[:200]] = HostCell(msg_id[:200], code[:MAX_CODE] if isinstance(code, str) else "")
        while len(self._cells) > MAX_CELLS:
            self._cells.popitem(last=False)

    def replied(self, msg: dict[str, Any]) -> str | None:
        """A kernel's shell message on its way to the host: if it is the ``execute_reply`` of a
        noted cell, note how it ended and return the cell's id (the reply frame's tag)."""
        header, parent, content = msg.get("header"), msg.get("parent_header"), msg.get("content")
        if not isinstance(header, dict) or header.get("msg_type") != "execute_reply":
            return None
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        cell = self._cells.get(msg_id) if isinstance(msg_id, str) else None
        if cell is None:
            return None
        content = content if isinstance(content, dict) else {}
        status = content.get("status")
        cell.status = status if isinstance(status, str) and status else "ok"
        count = content.get("execution_count")
        cell.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
        return cell.msg_id

    def heard(self, msg_ids: list[str]) -> None:
        """The host acknowledged the replies of these cells: it knows how they ended."""
        for msg_id in msg_ids:
            self._cells.pop(msg_id, None)

    def inherit(self) -> list[dict[str, Any]]:
        """What a new host must be told: every noted cell, oldest first. The finished ones are
        forgotten (the new host now knows how they ended); a running one stays until the new
        host acknowledges its reply."""
        told = [cell.to_json() for cell in self._cells.values()]
        for msg_id in [m for m, cell in self._cells.items() if cell.status is not None]:
            del self._cells[msg_id]
        return told
