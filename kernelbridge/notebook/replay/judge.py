"""Judging a replayed cell against the notebook's original: normalized outputs and verdicts.

No I/O and no kernels: outputs in, a :class:`CellVerdict` out; this module (with
:class:`ReplayReport`) is where a replay's outcomes are worded, the skipped cells' too
(:func:`skipped_empty` and its siblings). A cell is judged on what a reader
of the notebook would call its behaviour:

- whether it raised (``error`` outputs, or the cell's recorded ``status``), and with what
  exception type and message;
- its stdout and stderr text;
- its rich outputs (``display_data`` / ``execute_result``): for each, the MIME types present,
  every text value, and for PNG images their pixel size (the bytes of a plot differ with font
  hinting and library versions while the plot does not).

Tracebacks are not compared (their frames name cells by execution count), nor execution counts.

Volatile values are normalized away first (:func:`normalize_text`): memory addresses, dates and
times, durations, object ids and other long numbers, UUIDs and long hex tokens, and temporary
paths. The limits: a value that is random in a way not listed (a shuffled list, ``random()``)
counts as a difference, which is what a reader wants to know.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from kernelbridge.session.cell import strip_ansi

Verdict = Literal["same", "different", "error", "skipped"]
VERDICTS: tuple[Verdict, ...] = ("same", "different", "error", "skipped")
RAISED = frozenset({"error", "timeout", "kernel_died", "cancelled"})
"""Statuses that mean the cell did not complete normally."""
MAX_WHY_CHARS = 160
"""A verdict's reason is one line of the report."""

_VOLATILE: list[tuple[re.Pattern[str], str]] = [
    # ISO dates and times first: their parts would otherwise match the rules below piecemeal.
    (
        re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?"),
        "<datetime>",
    ),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "<date>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b"), "<time>"),
    (
        re.compile(r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\b"),
        "<day>",
    ),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x<addr>"),
    (
        re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
        "<uuid>",
    ),
    (re.compile(r"\b[0-9a-f]{24,}\b"), "<hex>"),
    (re.compile(r"(/tmp|/var/tmp|/dev/shm)/[^\s'\"()\[\],:;]*"), "<tmp>"),
    # Durations: "1.2 s", "35 ms", "3.4 µs ± 12 ns per loop (mean ± std. dev. of 7 runs, 100,000 loops each)".
    (re.compile(r"\b\d+(\.\d+)?(e[+-]?\d+)?\s?(ns|µs|us|ms|s|sec|secs|seconds|min|minutes)\b"), "<duration>"),
    (re.compile(r"\b[\d,]+ loops? each\b"), "<n> loops each"),
    # Object ids (id() is ~15 digits), nanosecond clocks, epoch milliseconds.
    (re.compile(r"\b\d{12,}\b"), "<id>"),
]


def normalize_text(text: str) -> str:
    """``text`` without terminal codes and with volatile values replaced by placeholders."""
    text = strip_ansi(text).replace("\r\n", "\n")
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


@dataclass(slots=True)
class Behaviour:
    """What is compared of one cell: its outputs, normalized."""

    raised: tuple[str, str] | None = None
    """(ename, normalized evalue) of the cell's exception, if it raised."""
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, str]] = field(default_factory=list)
    """One dict per rich output: MIME type -> normalized value (images: their size)."""


def png_size(data: str) -> str:
    """``"<png WxH>"`` for base64 PNG data (read from its IHDR chunk), ``"<png>"`` if unreadable."""
    try:
        head = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4), validate=False)
    except (binascii.Error, ValueError):
        return "<png>"
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR" or len(head) < 24:
        return "<png>"
    return f"<png {int.from_bytes(head[16:20], 'big')}x{int.from_bytes(head[20:24], 'big')}>"


def _value(mime: str, value: Any) -> str:
    if mime == "image/png" and isinstance(value, str):
        return png_size(value)
    if mime.startswith("image/") and not mime.endswith("svg+xml"):
        return f"<{mime}>"
    if isinstance(value, list):  # nbformat allows multi-line strings as lists
        value = "".join(str(v) for v in value)
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return normalize_text(value)


def behaviour(outputs: list[Any], status: str | None = None) -> Behaviour:
    """The comparable behaviour of a cell from its nbformat outputs (and recorded status)."""
    seen = Behaviour()
    stdout: list[str] = []
    stderr: list[str] = []
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            text = output.get("text", "")
            text = "".join(text) if isinstance(text, list) else str(text)
            (stderr if output.get("name") == "stderr" else stdout).append(text)
        elif kind in ("display_data", "execute_result"):
            data = output.get("data") or {}
            seen.displays.append({mime: _value(mime, value) for mime, value in sorted(data.items())})
        elif kind == "error":
            seen.raised = (str(output.get("ename", "")), normalize_text(str(output.get("evalue", ""))))
    seen.stdout = normalize_text("".join(stdout))
    seen.stderr = normalize_text("".join(stderr))
    if status in RAISED and status != "error":
        # A timeout is judged as a timeout: whether the interrupt landed (a KeyboardInterrupt
        # output) or the kernel had to be restarted depends on timing, not on the code.
        seen.raised = (str(status), "")
    elif seen.raised is None and status == "error":
        seen.raised = ("error", "")
    return seen


@dataclass(frozen=True, slots=True)
class CellVerdict:
    """The judgement of one code cell."""

    index: int
    """1-based number of the code cell in the notebook."""
    verdict: Verdict
    why: str = ""
    """One line: what differs, what raised, or why the cell was skipped."""

    def line(self) -> str:
        return f"cell {self.index:>3}  {self.verdict:<9}  {self.why}".rstrip()


def judge(index: int, original: Behaviour, replayed: Behaviour) -> CellVerdict:
    """Compare a replayed cell with its original."""
    if replayed.raised is not None and original.raised is None:
        ename, evalue = replayed.raised
        return CellVerdict(index, "error", _clip(f"{ename}: {evalue} (the original did not raise)"))
    if original.raised is not None and replayed.raised is None:
        return CellVerdict(
            index, "different", _clip(f"the original raised {original.raised[0]}; now it does not")
        )
    if original.raised != replayed.raised:
        assert original.raised is not None and replayed.raised is not None
        was, now = ": ".join(original.raised), ": ".join(replayed.raised)
        return CellVerdict(index, "different", _clip(f"raised {now!r}, the original {was!r}"))
    for name in ("stdout", "stderr"):
        was, now = getattr(original, name), getattr(replayed, name)
        if was != now:
            return CellVerdict(index, "different", _clip(f"{name} differs: {_first_difference(was, now)}"))
    if len(original.displays) != len(replayed.displays):
        n_was, n_now = len(original.displays), len(replayed.displays)
        return CellVerdict(index, "different", f"{n_now} rich outputs, the original had {n_was}")
    for n, (was_d, now_d) in enumerate(zip(original.displays, replayed.displays, strict=True), 1):
        if was_d.keys() != now_d.keys():
            return CellVerdict(
                index,
                "different",
                _clip(f"output {n} has types {sorted(now_d)}, the original {sorted(was_d)}"),
            )
        for mime in was_d:
            if was_d[mime] != now_d[mime]:
                why = f"output {n} ({mime}) differs: {_first_difference(was_d[mime], now_d[mime])}"
                return CellVerdict(index, "different", _clip(why))
    return CellVerdict(index, "same")


def skipped_empty(index: int) -> CellVerdict:
    return CellVerdict(index, "skipped", "empty cell")


def skipped_out_of_time(index: int, budget: float) -> CellVerdict:
    """The restore's time budget ran out before this cell."""
    return CellVerdict(index, "skipped", f"the restore's time budget of {budget:g} s ran out")


def skipped_unrecorded(index: int, servers: list[str]) -> CellVerdict:
    """The cell's calls to ``servers`` were not recorded in full: it cannot be replayed faithfully."""
    grants = " ".join(f"--grant {s}" for s in servers)
    why = f"its host tool calls were not recorded in full (`kernelbridge replay {grants}` calls them live)"
    return CellVerdict(index, "skipped", why)


def skipped_refused(index: int, reason: str) -> CellVerdict:
    """The session refused the cell (a server not configured here, ...): ``reason`` is its line."""
    return CellVerdict(index, "skipped", reason.splitlines()[0] if reason else "refused")


def _first_difference(was: str, now: str) -> str:
    """The first differing line of two texts, shown briefly."""
    was_lines, now_lines = was.splitlines() or [""], now.splitlines() or [""]
    for a, b in zip(was_lines, now_lines, strict=False):
        if a != b:
            return f"{a[:60]!r} -> {b[:60]!r}"
    if len(was_lines) != len(now_lines):
        return f"{len(now_lines)} lines, the original {len(was_lines)}"
    return f"{was[-40:]!r} -> {now[-40:]!r}"


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_WHY_CHARS else text[: MAX_WHY_CHARS - 3] + "..."


@dataclass(slots=True)
class ReplayReport:
    """Verdicts of every code cell of a replay, in notebook order."""

    cells: list[CellVerdict] = field(default_factory=list)
    where: str = "a fresh sandbox"
    budget: float | None = None
    """Seconds the whole replay was allowed (a restore: its run_python's timeout), if bounded."""
    seconds: float = 0.0
    """Seconds it took."""

    def count(self, verdict: Verdict) -> int:
        return sum(cell.verdict == verdict for cell in self.cells)

    def failed(self, strict: bool = False) -> bool:
        """A cell raised that did not raise in the original (or, ``strict``, any output differs)."""
        return self.count("error") > 0 or (strict and self.count("different") > 0)

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(v)} {v}" for v in VERDICTS)
        return f"replayed {len(self.cells)} code cells in {self.where}: {counts}"

    def text(self) -> str:
        return "\n".join([*(cell.line() for cell in self.cells), self.summary()])

    def as_dict(self) -> dict[str, Any]:
        return {
            "cells": [{"cell": c.index, "verdict": c.verdict, "why": c.why} for c in self.cells],
            "counts": {v: self.count(v) for v in VERDICTS},
            "budget_seconds": self.budget,
            "seconds": round(self.seconds, 2),
        }
