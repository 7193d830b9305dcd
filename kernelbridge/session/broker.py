"""One session's host MCP calls in flight: admission, dispatch to the hub, cancellation, records.

:meth:`RpcBroker.on_request` returns at once (it runs on the sandbox's event pump): a request with
no integer id is dropped, one past ``MAX_RPC_IN_FLIGHT`` answered ``busy``, one that belongs to no
running cell refused (which cell a call belongs to: docs/rpc.md, ``cell``); the others run as tasks
of their own, cancelled with their cell and answered ``cancelled``. Each ``call_tool`` is recorded
as a :class:`ToolCallRecord` (within :data:`MAX_RECORDED_BYTES`), each finished ``%pip install`` as
an ``InstallRecord``, under the cell. A handler's :class:`~kernelbridge.errors.RpcError` goes back
to the sandbox as it is; anything else it raises is a bug: logged at ERROR, answered ``internal``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio

from kernelbridge import frames
from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.calls.approval import ApprovalRequest, Approver, Decision
from kernelbridge.errors import RpcError
from kernelbridge.packages.record import InstallRecord
from kernelbridge.tunnel import RpcRequest

log = logging.getLogger(__name__)

MAX_RECORDED_BYTES = 1024 * 1024
"""Arguments or result of one tool call kept in the journal; bigger ones are marked truncated
(and cannot be replayed from the recording)."""
MAX_CALLS_PER_CELL = 1000
"""Tool calls recorded per cell; a loop of thousands keeps the first ones and a count."""
MAX_HELD_BYTES = 16 * 1024 * 1024
"""Arguments and results held in all, over every cell's records not yet collected. Each call may
keep up to MAX_RECORDED_BYTES, but a loop of a thousand 1 MB results would otherwise hold a
gigabyte in the bridge and write it to the journal; past this budget a call is recorded without
its data (server, tool, duration, ok/error, and ``*_truncated`` marks)."""
MAX_RECORDED_CELLS = 16
"""Cells whose records wait to be collected; records of cells nobody collects (an attached
client's, a forged cell id) are dropped oldest first."""
LATE_CALL_GRACE = 2.0
"""Seconds after its cell ended during which a call claiming that cell is still admitted as its own."""
MAX_TRACKED_CELLS = 64
"""Running and recently ended cells remembered (a session runs one at a time, plus a few clients')."""
CLAIM_WAIT = 2.0
"""Seconds a host call claiming a cell that is not running yet waits for it to begin: a Jupyter
client's cell begins when the recorder reads its first iopub message, which travels apart from
the rpc frames, so a call made in the cell's first line may arrive before it."""
MAX_WAITING_CLAIMS = 16
"""Cells waited for so at once; a call claiming one more cell that is not running is refused at once."""
MAX_INSTALLS_PER_CELL = 64
"""``%pip install`` records kept per cell (each is small: names, versions, hashes)."""
MAX_IN_FLIGHT_BYTES = 2 * frames.MAX_RPC_BYTES
"""Request bytes held by the calls of one session in flight: two maximal requests. A burst of
64 maximal requests would otherwise pin 2 GiB in the bridge; past it a request is answered ``busy``."""

Answer = Callable[..., Awaitable[None]]
"""``answer(request_id, result=...)`` or ``answer(request_id, error={kind, message})``."""
Spawn = Callable[..., object]
"""``start_soon`` of a task group that outlives the calls."""
_ABSENT: Any = object()
"""A record's arguments or result that was not kept (see ``*_truncated``)."""


@dataclass(slots=True)
class ToolCallRecord:
    """One ``call_tool`` a cell made, as the journal and the notebook record it."""

    server: str
    tool: str
    ok: bool
    """The call answered and its result was not ``isError``."""
    duration_ms: int
    error: str | None
    """``kind: message`` of a refused or failed call."""
    arguments: Any = _ABSENT
    """The call's arguments (JSON), unless too big to keep."""
    result: Any = _ABSENT
    """The answer (JSON), unless the call failed or it was too big to keep."""
    approval: Decision | None = None
    """What a person decided, for a call that needed approval (None: it needed none)."""

    @property
    def arguments_truncated(self) -> bool:
        return self.arguments is _ABSENT

    @property
    def result_truncated(self) -> bool:
        return self.result is _ABSENT and self.error is None

    def summary(self) -> dict[str, Any]:
        """What a ``run_python`` result shows of the call (``structuredContent.tool_calls``)."""
        summary = {"server": self.server, "tool": self.tool, "ok": self.ok, "duration_ms": self.duration_ms,
                   "error": self.error}  # fmt: skip
        if self.approval is not None:
            summary["approval"] = self.approval.value
        return summary

    def to_json(self) -> dict[str, Any]:
        """The journal's (and the notebook metadata's) form: the summary, then ``arguments`` or
        ``arguments_truncated: true``, then ``result`` or ``result_truncated: true`` (none for
        a failed call). :mod:`kernelbridge.replay.recorded` reads it back."""
        entry = self.summary()
        if self.arguments_truncated:
            entry["arguments_truncated"] = True
        else:
            entry["arguments"] = self.arguments
        if self.result_truncated:
            entry["result_truncated"] = True
        elif self.result is not _ABSENT:
            entry["result"] = self.result
        return entry


@dataclass(slots=True)
class _Call:
    request_id: int
    cell: str | None
    size: int = 0
    """JSON bytes of the request's params (counted against MAX_IN_FLIGHT_BYTES)."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    approval: Decision | None = None


class RpcBroker:
    """Admits, runs, cancels and records one session's rpc calls."""

    def __init__(
        self,
        session: str,
        handler: RpcHandler,
        answer: Answer,
        spawn: Spawn,
        grants: Callable[[], frozenset[str]],
        *,
        namespace: str = "",
        sandbox: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.sandbox = sandbox or secrets.token_hex(8)
        """Which sandbox the calls come from (``RpcCall.sandbox``): a session gets a new broker with
        each sandbox it attaches, so a fresh name per broker tells them apart."""
        self._clock = clock
        self.namespace = namespace
        """The HTTP token's namespace of the session (``""``: shared); every call carries it."""
        self._handler = handler
        self._answer = answer
        self._spawn = spawn
        self._grants = grants
        self._in_flight: dict[int, _Call] = {}
        self._in_flight_bytes = 0
        self._records: dict[str | None, list[ToolCallRecord]] = {}
        self._installs: dict[str | None, list[InstallRecord]] = {}
        self._held: dict[str | None, int] = {}
        """Bytes of arguments and results kept in ``_records``, per cell."""
        self._running: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Cells running now, in the order they began."""
        self._ended: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Cells that ended, with when (monotonic), the latest last."""
        self._claims: dict[str, anyio.Event] = {}
        """Cells that calls claim and wait for (:data:`CLAIM_WAIT`), set when they begin."""
        self._approvers: dict[str, Approver] = {}
        """Who can approve the calls of a cell (the ``run_python`` call running it), by cell."""
        self.refused = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def open_cell(self, msg_id: str) -> None:
        """``msg_id`` runs from now on (the session sent it, or a Jupyter client's cell began)."""
        self._ended.pop(msg_id, None)
        self._running[msg_id] = None
        self._running.move_to_end(msg_id)
        if (claim := self._claims.pop(msg_id, None)) is not None:
            claim.set()
        while len(self._running) > MAX_TRACKED_CELLS:
            self._running.popitem(last=False)

    def close_cell(self, msg_id: str) -> None:
        """``msg_id`` ended (or stopped being tracked); its calls still in flight run on."""
        if self._running.pop(msg_id, False) is None:
            self._ended[msg_id] = self._clock()
            while len(self._ended) > MAX_TRACKED_CELLS:
                self._ended.popitem(last=False)

    @contextlib.contextmanager
    def approving(self, msg_id: str, approver: Approver | None) -> Iterator[None]:
        """While in it, calls of cell ``msg_id`` that need approval ask ``approver`` (None, or
        after it: nobody can be asked, and they are refused)."""
        if approver is not None:
            self._approvers[msg_id] = approver
        try:
            yield
        finally:
            self._approvers.pop(msg_id, None)

    def cell_of(self, claimed: object) -> str | None:
        """The running cell a request claiming ``claimed`` belongs to, or None to refuse it."""
        if isinstance(claimed, str):
            if claimed in self._running:
                return claimed
            ended = self._ended.get(claimed)
            if ended is not None and self._clock() - ended <= LATE_CALL_GRACE:
                return claimed
        return next(reversed(self._running), None)

    async def on_request(self, request: RpcRequest) -> None:
        """Admit ``request`` and start its call, or answer it at once (see the module docstring)."""
        request_id = request.id
        if not isinstance(request_id, int) or isinstance(request_id, bool) or request_id <= 0:
            return  # no id to answer to; the agent already drops these
        cell = self.cell_of(request.cell)
        claimed = request.cell
        may_begin = isinstance(claimed, str) and claimed and claimed not in self._ended
        if cell is None and may_begin and len(self._claims) < MAX_WAITING_CLAIMS:
            assert isinstance(claimed, str)
            claim = self._claims.setdefault(claimed, anyio.Event())
            self._spawn(self._admit_when_begun, request, claimed, claim)
            return
        await self._admit(request, cell)

    async def _admit_when_begun(self, request: RpcRequest, claimed: str, claim: anyio.Event) -> None:
        """Admit ``request`` once the cell it claims begins, or refuse it after :data:`CLAIM_WAIT`."""
        with anyio.move_on_after(CLAIM_WAIT):
            await claim.wait()
        if self._claims.get(claimed) is claim:
            del self._claims[claimed]
        await self._admit(request, self.cell_of(claimed))

    async def _admit(self, request: RpcRequest, cell: str | None) -> None:
        request_id = request.id
        assert isinstance(request_id, int)
        if request_id in self._in_flight:
            await self._answer(
                request_id, error=_error("invalid_params", f"request id {request_id} is in flight")
            )
            return
        if cell is None:
            self.refused += 1
            await self._answer(request_id, error=_error("cancelled", _no_cell(request.cell)))
            return
        if len(self._in_flight) >= frames.MAX_RPC_IN_FLIGHT:
            self.refused += 1
            message = f"too many host calls in flight ({frames.MAX_RPC_IN_FLIGHT}); await some first"
            await self._answer(request_id, error=_error("busy", message))
            return
        size = _json_size(request.params)
        if self._in_flight and self._in_flight_bytes + size > MAX_IN_FLIGHT_BYTES:
            self.refused += 1
            message = (
                f"the host calls in flight already carry {self._in_flight_bytes:,} bytes of arguments; "
                "await some first"
            )
            await self._answer(request_id, error=_error("busy", message))
            return
        call = _Call(request_id, cell, size)
        self._in_flight[request_id] = call
        self._in_flight_bytes += size
        self._spawn(self._run, call, request.method, request.params)

    async def _run(self, call: _Call, method: object, params: object) -> None:
        started = time.monotonic()
        result: Any = None
        error: dict[str, str] | None = None
        try:
            rpc = RpcCall(
                self.session,
                self._grants(),
                str(method)[:100],
                params,
                namespace=self.namespace,
                sandbox=self.sandbox,
                approve=partial(self._approve, call),
            )
            with call.scope:
                result = await self._handler.dispatch(rpc)
            if call.scope.cancelled_caught:
                error = _error(
                    "cancelled", "the call was cancelled: its cell timed out or the session closed"
                )
        except RpcError as exc:
            error = _error(exc.kind, exc.message)
        except Exception:
            log.error("session %s: an rpc call failed", self.session, exc_info=True)
            error = _error("internal", "the host failed to answer this call (see the bridge's log)")
        finally:
            if self._in_flight.pop(call.request_id, None) is not None:
                self._in_flight_bytes -= call.size
        size = 0
        if error is None:
            size = _json_size(result)
            if size > frames.MAX_RPC_BYTES - 1024:
                error = _error(
                    "too_large", f"the result is {size:,} bytes; the limit is {frames.MAX_RPC_BYTES:,}"
                )
        if method == "call_tool":
            elapsed = time.monotonic() - started
            self._record(call, params, result if error is None else None, size, error, elapsed)
        elif method == "packages_done" and error is None:
            self._record_install(call.cell, result)
        with anyio.CancelScope(shield=True):
            if error is not None:
                await self._answer(call.request_id, error=error)
            else:
                await self._answer(call.request_id, result=result)

    async def _approve(self, call: _Call, request: ApprovalRequest) -> Decision:
        """Ask the approver of the call's cell, and note the decision for the call's record."""
        approver = self._approvers.get(call.cell) if call.cell is not None else None
        if approver is None:
            call.approval = Decision.NO_CLIENT
            return call.approval
        call.approval = Decision.UNANSWERED  # until an answer comes (the cell may end first)
        call.approval = await approver(request)
        return call.approval

    def cancel(self, cell: str | None = None) -> int:
        """Cancel the calls made by ``cell`` (every call when None). Returns how many."""
        calls = [c for c in self._in_flight.values() if cell is None or c.cell == cell]
        for call in calls:
            call.scope.cancel()
        return len(calls)

    def take_records(self, cell: str | None) -> list[ToolCallRecord]:
        """The recorded tool calls of ``cell`` (removed from the broker)."""
        self._held.pop(cell, None)
        return self._records.pop(cell, [])

    def take_installs(self, cell: str | None) -> list[InstallRecord]:
        """The ``%pip install`` records of ``cell`` (removed from the broker)."""
        return self._installs.pop(cell, [])

    def take_cell(self, cell: str | None) -> tuple[list[ToolCallRecord], list[InstallRecord]]:
        """Everything recorded of ``cell``: its tool calls and its installs (removed)."""
        return self.take_records(cell), self.take_installs(cell)

    def _record_install(self, cell: str | None, result: object) -> None:
        record = InstallRecord.from_json(result)
        installs = self._installs.setdefault(cell, [])
        if record is not None and len(installs) < MAX_INSTALLS_PER_CELL:
            installs.append(record)
        while len(self._installs) > MAX_RECORDED_CELLS:
            self._installs.pop(next(iter(self._installs)))

    @property
    def held_bytes(self) -> int:
        """Bytes of recorded arguments and results not collected yet (bounded by MAX_HELD_BYTES)."""
        return sum(self._held.values())

    def _keep(self, cell: str | None, size: int) -> bool:
        """Whether ``size`` more bytes of data may be recorded for ``cell``; counts them if so."""
        if size > MAX_RECORDED_BYTES or self.held_bytes + size > MAX_HELD_BYTES:
            return False
        self._held[cell] = self._held.get(cell, 0) + size
        return True

    def _record(
        self,
        call: _Call,
        params: object,
        result: Any,
        result_size: int,
        error: dict[str, str] | None,
        seconds: float,
    ) -> None:
        records = self._records.setdefault(call.cell, [])
        if len(records) >= MAX_CALLS_PER_CELL:
            return
        args = params if isinstance(params, dict) else {}
        record = ToolCallRecord(
            server=frames.clip(args.get("server"), 200),
            tool=frames.clip(args.get("tool"), 200),
            ok=error is None and not (isinstance(result, dict) and result.get("isError")),
            duration_ms=int(seconds * 1000),
            error=f"{error['kind']}: {error['message']}" if error else None,
            approval=call.approval,
        )
        arguments = args.get("arguments")
        if self._keep(call.cell, _json_size(arguments)):
            record.arguments = arguments
        if error is None and self._keep(call.cell, result_size):
            record.result = result
        records.append(record)
        # Keep the map small: records of cells nobody collects (an attached client's, a forged
        # cell id) must not pile up.
        while len(self._records) > MAX_RECORDED_CELLS:
            oldest = next(iter(self._records))
            self._records.pop(oldest)
            self._held.pop(oldest, None)


def approving(
    broker: RpcBroker | None, msg_id: str, approver: Approver | None
) -> contextlib.AbstractContextManager[None]:
    """:meth:`RpcBroker.approving` of ``broker``, or nothing to do when there is no broker."""
    return broker.approving(msg_id, approver) if broker is not None else contextlib.nullcontext()


def _no_cell(claimed: object) -> str:
    what = f"claims cell {frames.clip(claimed, 12)!r}, which is not running" if claimed else "names no cell"
    return (
        f"no cell is running in this session and this host call {what}: host calls are answered "
        "only while a cell of the session runs (a thread or task may call while a later cell runs)"
    )


def _error(kind: str, message: str) -> dict[str, str]:
    return {"kind": kind, "message": frames.clip(message, 2000)}


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return frames.MAX_RPC_BYTES
