"""Asking the MCP client's user about a host tool call, by elicitation, while the cell runs.

Handshake-era clients (2025-11-25 and older) get an ``elicitation/create`` request while
``run_python`` waits; 2026-07-28 clients get an ``InputRequiredResult`` and retry ``run_python`` with
the answers, the cell running meanwhile as a :class:`RunTable` task. Nothing here has a clock: the
wait is the cell's, and the cell's end withdraws its questions. A client that cannot elicit gets
``unsupported`` at once; an answer to anything but the question asked is ``malformed``, refused. Only
a call waiting for its retry runs on without a request; its result is kept :data:`KEEP_FINISHED`
seconds. Design: docs/design/server.md.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from kernelbridge.calls.approval import ApprovalRequest, Decision

log = logging.getLogger(__name__)

KEEP_FINISHED = 300.0
"""Seconds a detached call's result waits for the client's retry before it is dropped (the cell
itself is in the journal either way)."""
MAX_RUNS = 256
"""Detached calls a bridge keeps at once (each is a session's running cell: sessions bound them
anyway; this bounds what a client that never retries can leave)."""
FIELD = "approve"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        FIELD: {
            "type": "boolean",
            "title": "Allow this call",
            "description": "Accept (with this ticked) runs the call; decline or cancel refuses it.",
            "default": True,
        }
    },
}
"""The question's form: one boolean, true by default, so that accepting the dialog allows the call
and a client may also answer ``{"approve": false}``. Anything else is malformed."""

Mode = Literal["request", "input_required"]


def elicitation_mode(ctx: Context[Any, Any]) -> Mode | None:
    """How this request's client can be asked, or None when it cannot (see the module docstring)."""
    session = ctx.request_context.session
    capabilities = session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    # An empty `elicitation: {}` means form mode (the spec's default); url-only clients cannot
    # show this question.
    if elicitation is None or (elicitation.form is None and elicitation.url is not None):
        return None
    if session.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return "input_required"
    return "request" if session.can_send_request else None


def decision_of(answer: object) -> Decision:
    """The decision an elicitation answer means; anything that is not an answer is malformed."""
    try:
        result = (
            answer if isinstance(answer, types.ElicitResult) else types.ElicitResult.model_validate(answer)
        )
    except (ValidationError, TypeError, ValueError):
        return Decision.MALFORMED
    if result.action == "decline":
        return Decision.DECLINED
    if result.action == "cancel":
        return Decision.CANCELLED
    content = result.content or {}
    if set(content) - {FIELD}:
        return Decision.MALFORMED
    allowed = content.get(FIELD, True)
    if not isinstance(allowed, bool):
        return Decision.MALFORMED
    return Decision.ACCEPTED if allowed else Decision.DECLINED


@dataclass(eq=False)
class Question:
    """One approval request of a running cell, waiting for its answer."""

    key: str
    request: ApprovalRequest
    asked: bool = False
    decision: Decision | None = None
    answered: anyio.Event = field(default_factory=anyio.Event)
    withdrawn: anyio.Event = field(default_factory=anyio.Event)

    def answer(self, decision: Decision) -> None:
        if self.decision is None:
            self.decision = decision
            self.answered.set()

    def elicit_request(self) -> types.ElicitRequest:
        params = types.ElicitRequestFormParams(message=self.request.message(), requested_schema=SCHEMA)
        return types.ElicitRequest(params=params)


class CallRun:
    """One ``run_python`` call's cell, and the questions it asks, across the MCP requests of the call."""

    def __init__(self, namespace: str, mode: Mode | None) -> None:
        self.namespace = namespace
        self.mode = mode
        self.token = secrets.token_urlsafe(18)
        self.questions: dict[str, Question] = {}
        self.changed = anyio.Event()
        self.done = anyio.Event()
        self.outcome: Any = None
        self.error: BaseException | None = None
        self.scope = anyio.CancelScope()
        self.detached = False
        """Waiting for an InputRequiredResult's retry: no MCP request waits on it now."""
        self.progress: Callable[[float, str], Awaitable[None]] | None = None
        self.finished_at: float | None = None
        self._count = 0

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def approve(self, request: ApprovalRequest) -> Decision:
        """The session layer's approver for this call's cell (cancelled: the question is withdrawn)."""
        if self.mode is None:
            return Decision.UNSUPPORTED
        self._count += 1
        question = Question(f"approve-{self._count}", request)
        self.questions[question.key] = question
        self.notify()
        try:
            await question.answered.wait()
        finally:
            question.withdrawn.set()
            self.questions.pop(question.key, None)
        assert question.decision is not None
        return question.decision

    async def report(self, elapsed: float, tail: str) -> None:
        if self.progress is not None:
            await self.progress(elapsed, tail)

    def unasked(self) -> list[Question]:
        return [q for q in self.questions.values() if not q.asked]


class RunTable:
    """The calls of a bridge: their cells run as tasks of its task group (``async with``)."""

    def __init__(self) -> None:
        self._runs: dict[str, CallRun] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> RunTable:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    def start(self, run: CallRun, body: Callable[[], Awaitable[Any]]) -> None:
        """Run ``body`` (the cell) for ``run``; its outcome or exception is kept on ``run``."""
        assert self._tg is not None

        async def task() -> None:
            with run.scope:
                try:
                    run.outcome = await body()
                except Exception as exc:  # handed to the request that collects the run
                    run.error = exc
            if run.scope.cancelled_caught and run.error is None:
                run.error = anyio.get_cancelled_exc_class()()
            for question in list(run.questions.values()):
                question.answer(Decision.UNANSWERED)
            run.finished_at = anyio.current_time()
            run.done.set()
            run.notify()

        self._tg.start_soon(task)

    def spawn(self, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``body`` (an MCP task's call, :mod:`.tasks`) as a task of the bridge; it owns its errors."""
        assert self._tg is not None
        self._tg.start_soon(body)

    def detach(self, run: CallRun) -> None:
        """Keep ``run`` for a retry (it returned an InputRequiredResult)."""
        self._prune()
        if len(self._runs) >= MAX_RUNS:
            oldest = next(iter(self._runs.values()))
            self.drop(oldest)
        run.detached = True
        self._runs[run.token] = run

    def find(self, token: str | None, namespace: str) -> CallRun | None:
        run = self._runs.get(token) if token else None
        return run if run is not None and run.namespace == namespace else None

    def drop(self, run: CallRun) -> None:
        self._runs.pop(run.token, None)
        if not run.done.is_set():
            run.scope.cancel()

    def _prune(self) -> None:
        now = anyio.current_time()
        for run in list(self._runs.values()):
            if run.finished_at is not None and now - run.finished_at > KEEP_FINISHED:
                self._runs.pop(run.token, None)


async def ask_by_request(ctx: Context[Any, Any], question: Question) -> Decision:
    """A server-to-client elicitation request for ``question``; withdrawn (cancelled) if the
    question is (its cell ended)."""
    session = ctx.request_context.session
    decision = Decision.UNANSWERED

    async def ask(scope: anyio.CancelScope) -> None:
        nonlocal decision
        try:
            answer = await session.elicit_form(
                question.request.message(), requested_schema=SCHEMA, related_request_id=ctx.request_id
            )
            decision = decision_of(answer)
        except ValidationError:
            decision = Decision.MALFORMED
        except MCPError as exc:
            # -32601 (method not found) or a client refusing to show it: it cannot ask.
            log.info("elicitation refused by the client: %s", exc)
            decision = (
                Decision.UNSUPPORTED if exc.error.code == types.METHOD_NOT_FOUND else Decision.MALFORMED
            )
        scope.cancel()

    async def withdraw(scope: anyio.CancelScope) -> None:
        await question.withdrawn.wait()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, tg.cancel_scope)
        tg.start_soon(withdraw, tg.cancel_scope)
    return decision


def input_required(run: CallRun) -> types.InputRequiredResult:
    """The InputRequiredResult asking every question not asked yet (2026-07-28 clients)."""
    questions = run.unasked()
    for question in questions:
        question.asked = True
    requests: dict[str, types.InputRequest] = {q.key: q.elicit_request() for q in questions}
    return types.InputRequiredResult(input_requests=requests, request_state=run.token)


def take_answers(run: CallRun, responses: dict[str, Any] | None) -> None:
    """Resolve the asked questions with a retry's ``input_responses`` (missing ones are malformed)."""
    responses = responses or {}
    for key, question in list(run.questions.items()):
        if question.asked:
            question.answer(decision_of(responses[key]) if key in responses else Decision.MALFORMED)


async def drive(run: CallRun, ctx: Context[Any, Any], table: RunTable) -> types.InputRequiredResult | None:
    """Wait on ``run`` for this request: answer its questions the client's way, until the cell
    ends (None: collect ``run.outcome``) or an InputRequiredResult must go back to the client."""
    while True:
        if run.done.is_set():
            return None
        pending = run.unasked()
        if pending and run.mode == "input_required":
            table.detach(run)
            return input_required(run)
        if pending and run.mode == "request":
            question = pending[0]
            question.asked = True
            question.answer(await ask_by_request(ctx, question))
            continue
        await run.changed.wait()
