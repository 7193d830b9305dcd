"""One cell's outputs as Jupyter keeps them, in bounded memory.

:class:`CellOutputs` folds one ``execute_request``'s iopub messages into the outputs a notebook
saves, by nbclient's rules: streams coalesce with carriage returns applied, a waiting clear clears
at the next output, a display id updates every output that shows it (this cell's here, the others'
through the :class:`DisplayEvent` returned), ``transient`` is never stored. However much a cell
prints, each stream output keeps a head and a tail, rich outputs are capped by :data:`MAX_DISPLAYS`
and :data:`MAX_RICH_CHARS`, outputs in all by :data:`MAX_OUTPUTS`. It knows no sessions or MCP.

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kernelbridge.session.text import StreamText, cut_middle, strip_ansi
from kernelbridge.session.tracebacks import trim_traceback

MAX_DISPLAYS = 50
"""Rich outputs (display_data / execute_result) kept per cell; later ones are only counted."""
MAX_OUTPUTS = 200
"""Outputs of a cell in all (streams alternating with displays, or stdout with stderr); past it,
stream text joins the cell's last output of that stream."""
MAX_IMAGE_BYTES = 4 * 1024 * 1024
"""Largest base64 image/png kept; a bigger one is replaced by a note (the MCP message would be huge)."""
MAX_TRACEBACK_CHARS = 8_000
"""Deep recursion produces megabyte tracebacks; keep the head and the tail of one."""
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
MAX_DISPLAY_ID = 256
"""Characters of a display id (ipykernel's are 32 hex digits); a longer one is no display id."""


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
    message may be megabytes (a repr of data), and a hostile kernel may send anything. The
    notebook's output keeps IPython's colours, as Jupyter saves them; the model's text has none."""
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
    raw = {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": lines}
    return error, raw


def display_id_of(content: dict[str, Any]) -> str | None:
    """The ``transient.display_id`` of a display message, if it has a usable one (nbclient's
    trap: ``transient`` may be present and None)."""
    transient = content.get("transient")
    display_id = transient.get("display_id") if isinstance(transient, dict) else None
    if isinstance(display_id, str) and 0 < len(display_id) <= MAX_DISPLAY_ID:
        return display_id
    return None


@dataclass(frozen=True, slots=True)
class DisplayEvent:
    """A display message that carries a display id: every output with that id, in any cell of the
    session, now shows ``data`` and ``metadata`` (already bounded)."""

    display_id: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    size: int
    """Its weight against :data:`MAX_RICH_CHARS` (see there)."""


@dataclass(slots=True)
class StreamOutput:
    name: str
    text: StreamText


Output = StreamOutput | dict[str, Any]
"""A stream being written, or a finished nbformat output dict (display, result, error)."""


@dataclass(slots=True)
class CellOutputs:
    """The outputs of one cell, gathered from its iopub messages (see the module docstring)."""

    limit: int
    items: list[Output] = field(default_factory=list)
    """The outputs in notebook order."""
    display_ids: dict[str, list[int]] = field(default_factory=dict)
    """Display id -> indexes in :attr:`items` of the outputs that carry it."""
    clear_pending: bool = False
    """A ``clear_output(wait=True)`` came: the next output clears first."""
    displays: int = 0
    """Rich outputs in :attr:`items`."""
    dropped_displays: int = 0
    rich_chars: int = 0
    merged_streams: int = 0
    """Stream writes past :data:`MAX_OUTPUTS` that joined an earlier output of their stream."""
    error: CellError | None = None
    execution_count: int | None = None

    def handle(self, msg_type: str, content: dict[str, Any]) -> DisplayEvent | None:
        """Fold one iopub message of this cell into the outputs; returns the display event the
        other cells of the session must see too, if the message is one."""
        if msg_type == "execute_input":
            count = content.get("execution_count")
            self.execution_count = count if isinstance(count, int) else self.execution_count
        elif msg_type == "stream":
            self._clear_if_pending()
            self._stream(
                "stderr" if content.get("name") == "stderr" else "stdout", str(content.get("text", ""))
            )
        elif msg_type in ("display_data", "execute_result", "update_display_data"):
            return self._display(msg_type, content)
        elif msg_type == "error":
            self._clear_if_pending()
            self.error, raw = bounded_error(content, self.limit)
            self._rich(raw, sum(map(len, raw["traceback"])) + len(raw["evalue"]))
        elif msg_type == "clear_output":
            if content.get("wait"):
                self.clear_pending = True
            else:
                self._clear()
        return None

    # -- streams ------------------------------------------------------------------------------
    def _stream(self, name: str, text: str) -> None:
        last = self.items[-1] if self.items else None
        if not (isinstance(last, StreamOutput) and last.name == name) and len(self.items) >= MAX_OUTPUTS:
            earlier = [o for o in self.items if isinstance(o, StreamOutput) and o.name == name]
            if earlier:
                self.merged_streams += 1
                last = earlier[-1]
        if not (isinstance(last, StreamOutput) and last.name == name):
            last = StreamOutput(name, StreamText(self.limit))
            self.items.append(last)
        last.text.append(text)

    # -- displays -----------------------------------------------------------------------------
    def _display(self, msg_type: str, content: dict[str, Any]) -> DisplayEvent | None:
        data, metadata, size = bounded_display(content, self.limit)
        display_id = display_id_of(content)
        event = DisplayEvent(display_id, data, metadata, size) if display_id is not None else None
        if event is not None:
            self.update_display(event)  # before any waiting clear, as nbclient does
        if msg_type == "update_display_data":
            return event
        self._clear_if_pending()
        if msg_type == "execute_result":
            count = content.get("execution_count")
            self.execution_count = count if isinstance(count, int) else self.execution_count
        output: dict[str, Any] = {"output_type": msg_type, "data": data, "metadata": metadata}
        if msg_type == "execute_result":
            output["execution_count"] = self.execution_count
        if self._rich(output, size) and display_id is not None:
            self.display_ids.setdefault(display_id, []).append(len(self.items) - 1)
        return event

    def _rich(self, output: dict[str, Any], size: int) -> bool:
        """Add a rich output (or an error) within the caps; False when it is dropped (counted)."""
        if self.displays >= MAX_DISPLAYS or self.rich_chars + size > MAX_RICH_CHARS:
            self.dropped_displays += 1
            return False
        self.rich_chars += size
        self.displays += 1
        self.items.append(output)
        return True

    def update_display(self, event: DisplayEvent) -> bool:
        """Show ``event`` in this cell's outputs with its display id; False if it has none."""
        indexes = self.display_ids.get(event.display_id)
        if not indexes:
            return False
        for index in indexes:
            output = self.items[index]
            assert isinstance(output, dict)
            old = sum(_weight(v) for v in output["data"].values()) + JSON_WEIGHT * json_chars(
                output["metadata"]
            )
            if self.rich_chars - old + event.size > MAX_RICH_CHARS:
                self.dropped_displays += 1  # the update does not fit: the output keeps what it had
                continue
            self.rich_chars += event.size - old
            output["data"], output["metadata"] = dict(event.data), dict(event.metadata)
        return True

    # -- clearing -----------------------------------------------------------------------------
    def _clear_if_pending(self) -> None:
        if self.clear_pending:
            self.clear_pending = False
            self._clear()

    def _clear(self) -> None:
        # A progress display redrawing itself: forget what it drew so far, its display ids too
        # (an update of them no longer shows here, as nbclient's clear_display_id_mapping).
        self.items.clear()
        self.display_ids.clear()
        self.displays = self.dropped_displays = self.rich_chars = self.merged_streams = 0

    # -- what the cell shows ------------------------------------------------------------------
    def stream_text(self, name: str) -> str:
        """The text of the cell's ``name`` stream outputs, joined, cut to the limit."""
        text = "".join(
            o.text.render(name) for o in self.items if isinstance(o, StreamOutput) and o.name == name
        )
        return cut_middle(text, self.limit, name)[0]

    @property
    def result(self) -> str | None:
        """The text of the cell's ``execute_result`` (the value of its last expression)."""
        for output in reversed(self.items):
            if isinstance(output, dict) and output.get("output_type") == "execute_result":
                return cut_middle(str(output["data"].get("text/plain", "")), self.limit, "result")[0]
        return None

    def images(self) -> list[str]:
        """Base64 PNGs displayed by the cell, in order."""
        return [
            o["data"]["image/png"]
            for o in self.items
            if isinstance(o, dict) and isinstance(o.get("data", {}).get("image/png"), str)
        ]

    def notebook_outputs(self) -> list[dict[str, Any]]:
        """nbformat v4 output dicts, in order (streams rendered within their bounds)."""
        return [
            {"output_type": "stream", "name": o.name, "text": o.text.render(o.name)}
            if isinstance(o, StreamOutput)
            else o
            for o in self.items
        ]

    @property
    def truncated(self) -> bool:
        streams = [o for o in self.items if isinstance(o, StreamOutput)]
        joined = {
            name: sum(len(o.text.render(name)) for o in streams if o.name == name)
            for name in ("stdout", "stderr")
        }
        return (
            any(o.text.cut > 0 for o in streams)
            or any(chars > self.limit for chars in joined.values())
            or self.dropped_displays > 0
        )

    def progress_tail(self, n: int = 5) -> str:
        for name in ("stdout", "stderr"):
            for output in reversed(self.items):
                if isinstance(output, StreamOutput) and output.name == name:
                    return output.text.last_lines(n)
        return ""


def _weight(value: Any) -> int:
    return len(value) if isinstance(value, str) else JSON_WEIGHT * json_chars(value)


def bounded_display(content: dict[str, Any], limit: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    """A display message's data and metadata within the bounds, and their weight."""
    raw = content.get("data")
    data = {str(k): v for k, v in raw.items()} if isinstance(raw, dict) else {}
    png = data.get("image/png")
    if isinstance(png, str) and len(png) > MAX_IMAGE_BYTES:
        data["image/png"] = None
        data["text/plain"] = f"[image/png of {len(png):,} base64 characters omitted: too large]"
    data = {k: v for k, v in data.items() if v is not None}
    for key, value in data.items():
        if isinstance(value, str) and key != "image/png":
            data[key] = cut_middle(value, limit, key)[0]
    metadata = bounded_metadata(content.get("metadata"))
    size = sum(_weight(v) for v in data.values()) + JSON_WEIGHT * json_chars(metadata)
    return data, metadata, size
