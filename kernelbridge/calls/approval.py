"""A person's approval of one host tool call: the request, the decision, and what a refusal says.

A call matching ``KERNELBRIDGE_APPROVE_TOOLS`` (:meth:`Policy.needs_approval`) runs only on
:attr:`Decision.ACCEPTED`; any other decision, or no approver on the call (no MCP client waits on its
cell), is the ``denied`` error with a line saying why. The arguments are untrusted host data: a
request shows at most :data:`MAX_SHOWN_ARGUMENTS` characters of their JSON, never all of it. Who
supplies the approver: docs/architecture.md, "Host MCP calls".
"""

from __future__ import annotations

import enum
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kernelbridge.errors import RpcError

MAX_SHOWN_ARGUMENTS = 600
"""Characters of the arguments' JSON shown to the person (a 10 MB argument must not flood a dialog)."""
SETTING = "KERNELBRIDGE_APPROVE_TOOLS"


class Decision(enum.StrEnum):
    """What became of an approval request (the tool-call record's ``approval``)."""

    ACCEPTED = "accepted"
    DECLINED = "declined"
    """The person said no."""
    CANCELLED = "cancelled"
    """The person dismissed the question without choosing."""
    MALFORMED = "malformed"
    """The client's answer was not an answer to the question asked."""
    UNANSWERED = "unanswered"
    """No answer came before the cell ended (its timeout, the session closed, the client left)."""
    UNSUPPORTED = "unsupported"
    """The MCP client running the cell cannot ask its user (no elicitation capability)."""
    NO_CLIENT = "no_client"
    """No MCP client waits on the cell that made the call (an attached client's cell, a replay)."""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One call waiting for a person: who wants to call what, with which arguments."""

    session: str
    server: str
    tool: str
    arguments: dict[str, Any]
    namespace: str = ""

    @property
    def qualified(self) -> str:
        return f"{self.server}.{self.tool}"

    def shown_arguments(self) -> str:
        """The arguments as compact JSON, cut to :data:`MAX_SHOWN_ARGUMENTS` characters."""
        try:
            text = json.dumps(self.arguments, ensure_ascii=False, separators=(", ", ": "), default=str)
        except (TypeError, ValueError, RecursionError):
            text = "(arguments that are not JSON)"
        if len(text) > MAX_SHOWN_ARGUMENTS:
            text = f"{text[: MAX_SHOWN_ARGUMENTS - 40]} ... ({len(text):,} characters in all)"
        return text

    def message(self) -> str:
        """The question put to the person."""
        return (
            f"Code in session {self.session[:64]!r} wants to call {self.qualified[:200]} with"
            f" {self.shown_arguments()}: allow it?"
        )


Approver = Callable[[ApprovalRequest], Awaitable[Decision]]
"""Asks whoever can answer for the cell that made a call; returns the decision. Cancelling it
(the cell ended) withdraws the question."""


def refusal(decision: Decision, request: ApprovalRequest) -> RpcError:
    """The ``denied`` error a call gets when ``decision`` is not ACCEPTED (one line, for the model)."""
    what = f"{request.qualified} needs a person's approval ({SETTING})"
    why = {
        Decision.DECLINED: "and the person declined it",
        Decision.CANCELLED: "and the person dismissed the question without allowing it",
        Decision.MALFORMED: "and the MCP client's answer was not a valid answer, so it counts as no",
        Decision.UNANSWERED: "and no answer came before the cell ended",
        Decision.UNSUPPORTED: (
            f"but the MCP client running this cell cannot ask its user (it does not support"
            f" elicitation); use a client that does, or take the tool out of {SETTING}"
        ),
        Decision.NO_CLIENT: (
            "but no MCP client is waiting on the cell that made the call (a cell sent by an attached"
            " Jupyter client, or a replay), so nobody can be asked"
        ),
    }.get(decision, f"and the decision was {decision.value}")
    return RpcError("denied", f"{what}, {why}; the call was not made")
