"""One cell's outputs, collected from a kernel's messages with bounded memory, and its result.

This module owns what one ``execute_request`` produced: a :class:`Cell` gathers the iopub
messages whose parent is that request (fed by :mod:`kernelbridge.session.recorder`, which reads
every message of a session) and its shell reply. It knows nothing about sessions, timeout policy,
interrupts or MCP; :mod:`kernelbridge.session.runner` waits on a :class:`Cell` in slices and
decides what to do when a deadline passes, and :mod:`kernelbridge.server.render` turns a
:class:`CellResult` into MCP content.

Completion follows nbclient: a cell is done only when BOTH the iopub ``status: idle`` for its
request and its shell ``execute_reply`` have arrived. Either alone is not enough: the reply can
overtake the last outputs, and ``idle`` can arrive before the reply is read.

Memory stays bounded whatever the cell prints: stream text goes into :class:`BoundedText`, which
keeps a head and a tail of fixed size and only counts what falls in between, and rich outputs
are capped in number and size.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from kernelbridge.notebook.journal import CellSource
from kernelbridge.session.outcome import DisplaysDropped, Note, State, Status
from kernelbridge.session.tracebacks import trim_traceback

if TYPE_CHECKING:
    from kernelbridge.packages.record import InstallRecord
    from kernelbridge.session.broker import ToolCallRecord

# Why these bounds: a cell may print gigabytes or display thousands of images; the bridge must
# not hold them. The text caps come from Settings.output_limit; these cover rich outputs.
MAX_DISPLAYS = 50
"""Rich outputs (display_data / execute_result) kept per cell; later ones are only counted."""
MAX_IMAGE_BYTES = 4 * 1024 * 1024
"""Largest base64 image/png kept; a bigger one is replaced by a note (the MCP message would be huge)."""
MAX_TRACEBACK_CHARS = 8_000
"""Deep recursion produces megabyte tracebacks; keep the head and the tail of one."""
MAX_CODE_CHARS = 1_000_000
"""Source of another client's cell kept for the journal (the bridge's own is capped on input)."""
MAX_RICH_CHARS = 16 * 1024 * 1024
"""Total characters of rich outputs kept per cell, whatever their number. Values that are not
strings (``application/json`` data, metadata) count :data:`JSON_WEIGHT` times their JSON length:
parsed JSON costs the bridge several times its text in memory."""
JSON_WEIGHT = 4
MAX_METADATA_CHARS = 64 * 1024
"""JSON characters of one output's metadata (honestly: image sizes, a few flags). More is an
attack on the bridge's memory or the notebook's validity, and is replaced by a note."""
MAX_ERROR_NAME = 200
MAX_TRACEBACK_LINES = 200
"""Lines of an error's traceback kept for the notebook (each cut to MAX_TRACEBACK_CHARS)."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """Remove ANSI colour and cursor codes (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


def cut_middle(text: str, limit: int, what: str = "output") -> tuple[str, int]:
    """Keep the head and tail of ``text`` within ``limit`` characters; return (text, chars cut)."""
    if len(text) <= limit:
        return text, 0
    half = max(limit // 2, 1)
    cut = len(text) - 2 * half
    return f"{text[:half]}\n... [{cut:,} characters of {what} cut] ...\n{text[-half:]}", cut


class BoundedText:
    """Append-only text that remembers only its first and last ``limit // 2`` characters.

    The naive ``"".join(chunks)`` grows without bound; slicing a growing string on every append
    is quadratic. Instead the head fills once, and the tail is a deque of chunks trimmed from the
    left whenever it exceeds its budget, so memory is O(limit + largest chunk).
    """

    def __init__(self, limit: int) -> None:
        self._head_cap = max(limit // 2, 1)
        self._tail_cap = max(limit - self._head_cap, 1)
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self.total = 0
        """Characters ever appended."""

    def append(self, text: str) -> None:
        if not text:
            return
        self.total += len(text)
        room = self._head_cap - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, len(text))
            text = text[room:]
            if not text:
                return
        if len(text) > self._tail_cap:
            text = text[-self._tail_cap :]
        self._tail.append(text)
        self._tail_len += len(text)
        while self._tail_len - len(self._tail[0]) >= self._tail_cap:
            self._tail_len -= len(self._tail.popleft())

    @property
    def cut(self) -> int:
        """Characters dropped between head and tail."""
        return max(self.total - self._head_len - min(self._tail_len, self._tail_cap), 0)

    def render(self, what: str) -> str:
        head = "".join(self._head)
        tail = "".join(self._tail)[-self._tail_cap :] if self._tail else ""
        if self.cut == 0:
            return head + tail
        return f"{head}\n... [{self.cut:,} characters of {what} cut] ...\n{tail}"

    def last_lines(self, n: int) -> str:
        """The latest ``n`` lines written (for progress messages)."""
        text = "".join(self._tail) if self._tail else "".join(self._head)
        return "\n".join(text.rstrip("\n").splitlines()[-n:])


@dataclass(slots=True)
class CellError:
    """A cell's exception, as a model reads it."""

    ename: str
    evalue: str
    traceback: str
    """ANSI-free and compacted: what a model reads."""

    def as_dict(self) -> dict[str, str]:
        return {"ename": self.ename, "evalue": self.evalue, "traceback": self.traceback}


_NO_STDIN = (
    "StdinNotImplementedError: input() is not available here: nobody can type an answer. "
    "Put the value in the code instead."
)


def compact_traceback(lines: list[Any]) -> str:
    """Join IPython's traceback lines without colour codes or the rule line of dashes, and with
    the library frames before the raising one left out (:mod:`.tracebacks`; the error output the
    journal keeps is the whole traceback)."""
    text = "\n".join(trim_traceback([strip_ansi(str(line)) for line in lines]).parts)
    text = "\n".join(line for line in text.splitlines() if not re.fullmatch(r"-{20,}", line.strip()))
    return cut_middle(text.strip("\n"), MAX_TRACEBACK_CHARS, "traceback")[0]


def json_chars(value: Any) -> int:
    """Characters of ``value`` as JSON (values here came from JSON, at most 64 levels deep)."""
    try:
        return len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return MAX_RICH_CHARS


def bounded_metadata(value: Any) -> dict[str, Any]:
    """An output's metadata, or a note in its place when it is not a small JSON object."""
    if not isinstance(value, dict) or not value:
        return {}
    chars = json_chars(value)
    if chars > MAX_METADATA_CHARS:
        return {
            "kernelbridge": f"metadata of {chars:,} JSON characters dropped (limit {MAX_METADATA_CHARS:,})"
        }
    return value


def bounded_error(content: dict[str, Any], limit: int) -> tuple[CellError, dict[str, Any]]:
    """An ``error`` message's (or an error reply's) parts, each cut to a bound: an exception's
    message may be megabytes (a repr of data), and a hostile kernel may send anything."""
    raw_tb = content.get("traceback")
    lines = [str(t)[:MAX_TRACEBACK_CHARS] for t in (raw_tb if isinstance(raw_tb, list) else [])]
    if len(lines) > MAX_TRACEBACK_LINES:
        half = MAX_TRACEBACK_LINES // 2
        lines = [*lines[:half], f"... [{len(lines) - 2 * half} traceback lines cut] ...", *lines[-half:]]
    ename = str(content.get("ename", ""))[:MAX_ERROR_NAME]
    evalue = cut_middle(str(content.get("evalue", "")), limit, "error message")[0]
    error = CellError(
        ename=ename,
        evalue=evalue,
        traceback=_NO_STDIN if ename == "StdinNotImplementedError" else compact_traceback(lines),
    )
    raw = {
        "output_type": "error",
        "ename": ename,
        "evalue": evalue,
        "traceback": [strip_ansi(line) for line in lines],
    }
    return error, raw


REPLY_KEYS = ("status", "execution_count", "ename", "evalue", "traceback")


def bounded_reply(content: dict[str, Any], limit: int) -> dict[str, Any]:
    """The parts of an execute_reply the bridge uses, bounded (the rest is never kept)."""
    reply = {key: content[key] for key in REPLY_KEYS if key in content}
    if not isinstance(reply.get("status"), str):
        reply.pop("status", None)
    if reply.get("status") == "error" or "ename" in reply:
        error, raw = bounded_error(content, limit)
        reply.update(ename=error.ename, evalue=error.evalue, traceback=raw["traceback"])
    return reply


@dataclass(slots=True)
class CellOutputs:
    """The outputs of one cell, gathered from its iopub messages, in bounded memory."""

    limit: int
    stdout: BoundedText = field(init=False)
    stderr: BoundedText = field(init=False)
    displays: list[dict[str, Any]] = field(default_factory=list)
    """nbformat display_data / execute_result outputs, at most MAX_DISPLAYS."""
    order: list[str | int] = field(default_factory=list)
    """Output order for the notebook: a stream name at its first write, or an index in displays."""
    dropped_displays: int = 0
    rich_chars: int = 0
    result: str | None = None
    error: CellError | None = None
    raw_error: dict[str, Any] | None = None
    execution_count: int | None = None

    def __post_init__(self) -> None:
        self.stdout = BoundedText(self.limit)
        self.stderr = BoundedText(self.limit)

    def handle(self, msg_type: str, content: dict[str, Any]) -> None:
        """Fold one iopub message of this cell into the outputs."""
        if msg_type == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            if name not in self.order:
                self.order.append(name)
            (self.stderr if name == "stderr" else self.stdout).append(str(content.get("text", "")))
        elif msg_type in ("display_data", "execute_result"):
            self._add_display(msg_type, content)
        elif msg_type == "error":
            self.error, self.raw_error = bounded_error(content, self.limit)
        elif msg_type == "execute_input":
            self.execution_count = content.get("execution_count", self.execution_count)
        elif msg_type == "clear_output":
            # A progress display redrawing itself: forget what it drew so far.
            self.stdout = BoundedText(self.limit)
            self.stderr = BoundedText(self.limit)
            self.displays.clear()
            self.order.clear()
            self.rich_chars = 0

    def _add_display(self, msg_type: str, content: dict[str, Any]) -> None:
        raw = content.get("data")
        data = dict(raw) if isinstance(raw, dict) else {}
        if msg_type == "execute_result":
            self.execution_count = content.get("execution_count", self.execution_count)
            text = str(data.get("text/plain", ""))
            self.result = cut_middle(text, self.limit, "result")[0]
        png = data.get("image/png")
        if isinstance(png, str) and len(png) > MAX_IMAGE_BYTES:
            data["image/png"] = None
            data["text/plain"] = f"[image/png of {len(png):,} base64 characters omitted: too large]"
        data = {k: v for k, v in data.items() if v is not None}
        for key, value in data.items():
            if isinstance(value, str) and key != "image/png":
                data[key] = cut_middle(value, self.limit, key)[0]
        size = sum(len(v) if isinstance(v, str) else JSON_WEIGHT * json_chars(v) for v in data.values())
        metadata = bounded_metadata(content.get("metadata"))
        size += JSON_WEIGHT * json_chars(metadata)
        if len(self.displays) >= MAX_DISPLAYS or self.rich_chars + size > MAX_RICH_CHARS:
            self.dropped_displays += 1
            return
        self.rich_chars += size
        output: dict[str, Any] = {
            "output_type": msg_type,
            "data": data,
            "metadata": metadata,
        }
        if msg_type == "execute_result":
            output["execution_count"] = self.execution_count
        self.order.append(len(self.displays))
        self.displays.append(output)

    def images(self) -> list[str]:
        """Base64 PNGs displayed by the cell, in order."""
        return [d["data"]["image/png"] for d in self.displays if isinstance(d["data"].get("image/png"), str)]

    def notebook_outputs(self) -> list[dict[str, Any]]:
        """nbformat v4 output dicts (streams already capped) in first-appearance order."""
        outputs: list[dict[str, Any]] = []
        for item in self.order:
            if isinstance(item, int):
                outputs.append(self.displays[item])
            else:
                buf = self.stderr if item == "stderr" else self.stdout
                outputs.append({"output_type": "stream", "name": item, "text": buf.render(item)})
        if self.raw_error is not None:
            outputs.append(self.raw_error)
        return outputs

    @property
    def truncated(self) -> bool:
        return self.stdout.cut > 0 or self.stderr.cut > 0 or self.dropped_displays > 0

    def progress_tail(self, n: int = 5) -> str:
        return self.stdout.last_lines(n) or self.stderr.last_lines(n)


@dataclass(frozen=True, slots=True)
class CellClient:
    """Who sent another client's cell, as its verified execute request said."""

    username: str
    session: str


class Cell:
    """One execute request as seen on iopub, whichever client sent it, with its shell reply when
    the bridge sent it. Fed by :class:`kernelbridge.session.recorder.Recorder`; awaited by the
    session's :class:`~kernelbridge.session.runner.CellRunner`.

    Times come from ``clock`` (monotonic seconds, the runner's clock): ``queued`` when the request
    was sent (or first seen), ``started`` when the kernel began it (``status: busy``),
    ``finished`` at ``status: idle``. A call's timeout counts from ``started``: time spent queued
    behind another client's cell is not the cell's.
    """

    def __init__(
        self,
        msg_id: str,
        limit: int,
        source: CellSource = "mcp",
        code: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.msg_id = msg_id
        self.source: CellSource = source
        self.code = code
        self.outputs = CellOutputs(limit)
        self._clock = clock
        self.queued = clock()
        self.queued_wall = time.time()
        self.started: float | None = None
        self.finished: float | None = None
        self.reply: dict[str, Any] | None = None
        self.client: CellClient | None = None
        """Who sent it, when it was not the bridge."""
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        state = "done" if self.done else "running" if self.started else "queued"
        return f"<Cell {self.msg_id[:8]} {self.source} {state}>"

    @property
    def idle(self) -> bool:
        return self.finished is not None

    @property
    def done(self) -> bool:
        """Complete, as nbclient defines it: idle on iopub AND the reply (if we wait for one)."""
        return self.idle and (self.source != "mcp" or self.reply is not None)

    def on_iopub(self, msg_type: str, content: dict[str, Any]) -> None:
        """Fold one iopub message whose parent is this cell's request."""
        if msg_type == "status":
            state = content.get("execution_state")
            if state == "busy" and self.started is None:
                self.started = self._clock()
            elif state == "idle":
                self.started = self.started or self._clock()
                self.finished = self._clock()
        else:
            if msg_type == "execute_input" and self.code is None:
                self.code = str(content.get("code", ""))[:MAX_CODE_CHARS]
            self.outputs.handle(msg_type, content)
        self.notify()

    def on_reply(self, content: dict[str, Any]) -> None:
        """The shell reply to this cell's request (the bridge's own cells)."""
        self.reply = bounded_reply(content, self.outputs.limit)
        count = content.get("execution_count")
        if isinstance(count, int):
            self.outputs.execution_count = count
        self.notify()

    def notify(self) -> None:
        """Wake whoever waits on :attr:`change_event`."""
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def change_event(self) -> anyio.Event:
        """Set at the next change of the cell (a message, the reply, the sandbox ending)."""
        return self._changed

    async def changed(self, deadline: float) -> None:
        """Wait until something about the cell changes or ``deadline`` (of the clock) passes."""
        event = self._changed
        with anyio.move_on_after(max(deadline - self._clock(), 0)):
            await event.wait()

    def elapsed_ms(self) -> int:
        """Milliseconds the kernel has spent on the cell (0 while it waits in the queue)."""
        if self.started is None:
            return 0
        return int(((self.finished or self._clock()) - self.started) * 1000)

    def waited_ms(self) -> int:
        """Milliseconds the cell waited behind other work before the kernel began it."""
        return int(((self.started or self._clock()) - self.queued) * 1000)


@dataclass(slots=True)
class CellResult:
    """What one ``run_python`` call produced; the server renders it, the journal records it."""

    status: Status
    session: str
    execution_count: int | None
    stdout: str
    stderr: str
    result: str | None
    error: CellError | None
    truncated: bool
    duration_ms: int
    state: State
    images: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    """Host MCP calls the cell made, for the journal and the notebook."""
    packages: list[InstallRecord] = field(default_factory=list)
    """``%pip install``s the cell made through the host, for the journal and a restore."""
    waited_ms: int = 0
    """Time the cell waited behind another client's cell before it started."""
    notes: list[Note] = field(default_factory=list)
    """What to tell about the session itself (a restart, a fresh kernel, dropped outputs)."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """nbformat outputs for the journal."""


def finish_cell(
    run: Cell, *, session: str, status: Status, state: State, notes: list[Note] | None = None
) -> CellResult:
    """Freeze a cell (complete or not) into a CellResult."""
    out = run.outputs
    error = out.error
    if out.execution_count is None and run.reply is not None:
        out.execution_count = run.reply.get("execution_count")
    if status is Status.OK and run.reply is not None and run.reply.get("status") in ("error", "aborted"):
        status = Status.ERROR
        if error is None:
            reply = run.reply
            error = CellError(
                str(reply.get("ename", "Aborted")),
                str(reply.get("evalue", "")),
                compact_traceback([str(t) for t in reply.get("traceback") or []]),
            )
    if status is Status.OK and error is not None:
        status = Status.ERROR
    notes = list(notes or [])
    if out.dropped_displays:
        notes.append(DisplaysDropped(out.dropped_displays, MAX_DISPLAYS))
    return CellResult(
        status=status,
        session=session,
        execution_count=out.execution_count,
        stdout=out.stdout.render("stdout"),
        stderr=out.stderr.render("stderr"),
        result=out.result,
        error=error,
        truncated=out.truncated,
        duration_ms=run.elapsed_ms(),
        state=state,
        images=out.images(),
        notes=notes,
        outputs=out.notebook_outputs(),
    )
