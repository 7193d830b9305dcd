"""Judging a replayed cell against the notebook's original: normalized outputs and verdicts.

No I/O and no kernels: outputs in, a :class:`CellVerdict` out; this module (with
:class:`ReplayReport`) is where a replay's outcomes are worded. A cell is judged on what a reader
of the notebook would call its behaviour: whether it raised and with what, its stdout and stderr,
its rich outputs by MIME type and text (PNGs by pixel size); never tracebacks or execution counts.
Volatile values are normalized away first (:func:`normalize_text`: addresses, dates and times,
durations, ids, long numbers and hex tokens, temporary paths); a value random in another way
counts as a difference, which is what a reader wants to know. A cell the original never ran is
``unexecuted`` (an error then, unless tagged ``raises-exception``); an error that follows from an
earlier failed cell (a ``NameError`` for a name it would have bound) is counted with its cause.
Explanations are printed whole: a quoted value may be shortened, the sentence never.
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kernelbridge.notebook.access import Lacking
from kernelbridge.session.cell import strip_ansi

Verdict = Literal["same", "different", "error", "unexecuted", "skipped"]
VERDICTS: tuple[Verdict, ...] = ("same", "different", "error", "unexecuted", "skipped")
SHOWN_ALWAYS: frozenset[Verdict] = frozenset({"same", "different", "error", "skipped"})
"""Counts the summary shows even when zero (scripts read them); ``unexecuted`` only when some."""
RAISED = frozenset({"error", "timeout", "kernel_died", "cancelled"})
"""Statuses that mean the cell did not complete normally."""
MAX_QUOTED_CHARS = 1000
"""Characters of a value quoted in a verdict's reason (a differing line, an exception's message);
a longer one is shortened at a word boundary, saying how much was left out."""
_UNDEFINED = re.compile(r"^name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")

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
    follows: int | None = None
    """An ``error`` caused by the failure of this earlier cell (its number)."""

    def line(self) -> str:
        why = f"follows from cell {self.follows}: {self.why}" if self.follows is not None else self.why
        return f"cell {self.index:>3}  {self.verdict:<9}  {why}".rstrip()


def judge(index: int, original: Behaviour, replayed: Behaviour) -> CellVerdict:
    """Compare a replayed cell with its original."""
    if replayed.raised is not None and original.raised is None:
        ename, evalue = replayed.raised
        return CellVerdict(
            index, "error", _one_line(f"{ename}: {_quoted(evalue)} (the original did not raise)")
        )
    if original.raised is not None and replayed.raised is None:
        return CellVerdict(index, "different", f"the original raised {original.raised[0]}; now it does not")
    if original.raised != replayed.raised:
        assert original.raised is not None and replayed.raised is not None
        was, now = _quoted(": ".join(original.raised)), _quoted(": ".join(replayed.raised))
        return CellVerdict(index, "different", f"raised {now!r}, the original {was!r}")
    for name in ("stdout", "stderr"):
        was, now = getattr(original, name), getattr(replayed, name)
        if was != now:
            return CellVerdict(index, "different", f"{name} differs: {_first_difference(was, now)}")
    if len(original.displays) != len(replayed.displays):
        n_was, n_now = len(original.displays), len(replayed.displays)
        return CellVerdict(index, "different", f"{n_now} rich outputs, the original had {n_was}")
    for n, (was_d, now_d) in enumerate(zip(original.displays, replayed.displays, strict=True), 1):
        if was_d.keys() != now_d.keys():
            why = f"output {n} has types {sorted(now_d)}, the original {sorted(was_d)}"
            return CellVerdict(index, "different", why)
        for mime in was_d:
            if was_d[mime] != now_d[mime]:
                why = f"output {n} ({mime}) differs: {_first_difference(was_d[mime], now_d[mime])}"
                return CellVerdict(index, "different", why)
    return CellVerdict(index, "same")


def unexecuted(index: int, replayed: Behaviour, *, may_raise: bool = False) -> CellVerdict:
    """A cell the original never ran: run now, not compared. If it raised it is an ``error``, as
    ``jupyter nbconvert --execute`` fails on it: nothing recorded says it may (``may_raise``: the
    cell is tagged ``raises-exception``, as nbclient reads it, and stays ``unexecuted``)."""
    if replayed.raised is not None:
        ename, evalue = replayed.raised
        now = f"now it raised {ename}: {_quoted(evalue)}" if evalue else f"now it raised {ename}"
    else:
        now = "now it ran without an error"
    verdict: Verdict = "error" if replayed.raised is not None and not may_raise else "unexecuted"
    return CellVerdict(index, verdict, f"not executed in the original; {now}")


def ran_in_original(cell_outputs: list[Any], execution_count: object, meta: dict[str, Any]) -> bool:
    """Whether the original notebook records an execution of a cell: an execution count (Jupyter
    gives every cell it runs one), an output, or kernelbridge's journal saying who ran it."""
    return bool(cell_outputs) or execution_count is not None or "source" in meta or "status" in meta


class FailedNames:
    """Names that cells which failed in the replay would have bound, and which cell's failure each
    goes back to: a later ``NameError`` for one of them follows from that cell."""

    def __init__(self) -> None:
        self._root: dict[str, int] = {}

    def failed(self, verdict: CellVerdict, source: str) -> None:
        """``verdict`` is the judgement of a cell that raised in the replay (``source``: its code)."""
        root = verdict.follows if verdict.follows is not None else verdict.index
        for name in bound_names(source):
            self._root.setdefault(name, root)

    def cause(self, verdict: CellVerdict, replayed: Behaviour) -> CellVerdict:
        """``verdict`` as following from an earlier cell, if its new error is a NameError of ours."""
        if verdict.verdict != "error" or replayed.raised is None or replayed.raised[0] != "NameError":
            return verdict
        match = _UNDEFINED.match(replayed.raised[1])
        root = self._root.get(match.group(1)) if match else None
        return CellVerdict(verdict.index, "error", verdict.why, follows=root) if root is not None else verdict


def bound_names(source: str) -> set[str]:
    """Names a cell binds at its top level (assignments, imports, definitions, loop and ``with``
    targets), IPython's syntax (magics, ``!`` commands) translated first; empty if unreadable."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        manager: Any = TransformerManager  # untyped
        tree = ast.parse(manager().transform_cell(source))
    except Exception:  # IPython's transformer or the parser: any failure means "nothing known"
        return set()
    names: set[str] = set()
    for node in _top_level(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
    return names


PATH_ERRORS = frozenset({"FileNotFoundError", "NotADirectoryError", "IsADirectoryError", "PermissionError"})
"""Exceptions of a cell that may come from a host directory the replay does not mount."""


def lacking_notes(lacking: Lacking) -> list[str]:
    """What the original session's sandboxes had that the replay's lack, one line each, said
    before the cells (a cell that needs it fails, and the report would blame it)."""
    notes = [
        f"the original session had a host directory mounted on {target} (read-only); this replay"
        f" has none there: set KERNELBRIDGE_MOUNTS=SRC:{target} to give it one"
        for target in lacking.mounts
    ]
    now = lacking.now.packages if lacking.now is not None else "none"
    if lacking.packages == ("any",):
        notes.append(
            "the original session could %pip install any package; this replay's KERNELBRIDGE_PACKAGES"
            f" allows {'none' if now == 'none' else 'only some'}"
        )
    elif lacking.packages:
        names = ", ".join(lacking.packages[:10]) + (", ..." if len(lacking.packages) > 10 else "")
        notes.append(
            f"the original session could %pip install {names}, which this replay's KERNELBRIDGE_PACKAGES"
            " does not allow"
        )
    return notes


def with_hint(verdict: CellVerdict, replayed: Behaviour, lacking: Lacking) -> CellVerdict:
    """``verdict`` with the likely cause of its new error, when the replay lacks what the original
    had: a missing mount for a path error (the one its message names, if it names one), the
    package policy for a missing module."""
    if verdict.verdict != "error" or replayed.raised is None or not lacking:
        return verdict
    ename, evalue = replayed.raised
    hint = ""
    if ename in PATH_ERRORS and lacking.mounts:
        target = lacking.mount_of(evalue)
        mounted = target or ", ".join(lacking.mounts)
        hint = f"the original had {mounted} mounted; this replay does not"
    elif ename == "ModuleNotFoundError" and lacking.packages:
        hint = "the original could %pip install packages this replay's KERNELBRIDGE_PACKAGES does not allow"
    return replace(verdict, why=f"{verdict.why} ({hint})") if hint else verdict


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


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)  # fmt: skip


def _top_level(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it holds, but not the inside of functions, classes and comprehensions
    (their names are their own)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _SCOPES):
            yield child
        else:
            yield from _top_level(child)


def _first_difference(was: str, now: str) -> str:
    """The first differing line of two texts, each whole (or shortened, saying so)."""
    was_lines, now_lines = was.splitlines() or [""], now.splitlines() or [""]
    for a, b in zip(was_lines, now_lines, strict=False):
        if a != b:
            return f"{_quoted(a)!r} -> {_quoted(b)!r}"
    if len(was_lines) != len(now_lines):
        return f"{len(now_lines)} lines, the original {len(was_lines)}"
    return f"{_quoted(was[-MAX_QUOTED_CHARS:])!r} -> {_quoted(now[-MAX_QUOTED_CHARS:])!r}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _quoted(text: str) -> str:
    """``text`` on one line, shortened past :data:`MAX_QUOTED_CHARS` at a word boundary, saying so."""
    text = " ".join(text.split())
    if len(text) <= MAX_QUOTED_CHARS:
        return text
    cut = text.rfind(" ", 0, MAX_QUOTED_CHARS)
    cut = cut if cut >= MAX_QUOTED_CHARS // 2 else MAX_QUOTED_CHARS
    return f"{text[:cut].rstrip()} [... {len(text) - cut:,} more characters]"


@dataclass(slots=True)
class ReplayReport:
    """Verdicts of every code cell of a replay, in notebook order."""

    cells: list[CellVerdict] = field(default_factory=list)
    where: str = "a fresh sandbox"
    budget: float | None = None
    """Seconds the whole replay was allowed (a restore: its run_python's timeout), if bounded."""
    seconds: float = 0.0
    """Seconds it took."""

    notes: list[str] = field(default_factory=list)
    """What the notebook had that the replay could not use (one line each: an output of a type
    nbformat does not know, a repaired kernelspec)."""

    def count(self, verdict: Verdict) -> int:
        """Cells of ``verdict`` (errors that follow from an earlier cell's are counted with it)."""
        return sum(cell.verdict == verdict and cell.follows is None for cell in self.cells)

    @property
    def following(self) -> int:
        """Errors that follow from an earlier cell's failure."""
        return sum(cell.follows is not None for cell in self.cells)

    def failed(self, strict: bool = False) -> bool:
        """A cell raised that did not raise in the original (or, ``strict``, any output differs)."""
        return self.count("error") > 0 or (strict and self.count("different") > 0)

    def summary(self) -> str:
        parts = []
        for verdict in VERDICTS:
            count = self.count(verdict)
            if count or verdict in SHOWN_ALWAYS:
                parts.append(f"{count} {verdict}")
            if verdict == "error" and self.following:
                parts[-1] += f" (and {self.following} that follow from {'it' if count == 1 else 'them'})"
        return f"replayed {len(self.cells)} code cells in {self.where}: {', '.join(parts)}"

    def text(self) -> str:
        notes = [f"note: {note}" for note in self.notes]
        return "\n".join([*notes, *(cell.line() for cell in self.cells), self.summary()])

    def as_dict(self) -> dict[str, Any]:
        cells: list[dict[str, Any]] = []
        for c in self.cells:
            cells.append({"cell": c.index, "verdict": c.verdict, "why": c.why})
            if c.follows is not None:
                cells[-1]["follows"] = c.follows
        return {
            "cells": cells,
            "counts": {**{v: self.count(v) for v in VERDICTS}, "follows": self.following},
            "notes": list(self.notes),
            "budget_seconds": self.budget,
            "seconds": round(self.seconds, 2),
        }
