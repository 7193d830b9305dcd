"""Tracebacks for the model: the user's frames and the one that raised, the library frames between left out.

Each exception of IPython's structured traceback (ANSI codes removed) keeps its user frames (a cell,
a file outside the installed packages and the standard library) and its last frame, its signature
shortened to ``name(...)``; one line says how many library frames, compiled ones too, were left
out. Frames of kernelbridge's own sandbox code are always left out. A part it does not recognise is
kept as it is: an unknown format is never shortened wrongly. Pure functions, no I/O.

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_KEPT_SIGNATURE = 120
"""A kept library frame's header longer than this has its parameter list shortened to ``(...)``."""

_CELL = re.compile(r"^\s*(Cell In\s*\[|Input In\s*\[|<ipython-input-)")
_FILE = re.compile(r"^\s*File (?P<path>.+?):(?P<line>\d+)(?:, in (?P<name>[^\s(]+)(?P<args>\(.*\))?)?\s*$")
_LIBRARY_PATH = re.compile(r"/(?:site|dist)-packages/|/lib/python3(?:\.\d+)?/|^<frozen ")
# A compiled (Cython) frame: its path is the source's, relative to its package's root, and that
# source is not installed (a .pyx; or a .py compiled in Cython's pure Python mode, as pyzmq's).
_COMPILED_PATH = re.compile(r"^(?P<package>[A-Za-z_][A-Za-z0-9_]*)/\S*\.(?P<ext>pyx|pxd|pxi|py)$")
_OWN_PATH = re.compile(r"/kernelbridge/inside/")
_PACKAGE = re.compile(r"/(?:site|dist)-packages/(?P<package>[A-Za-z0-9_.]+)")
_NO_SOURCE = re.compile(
    r"^.*'Could not get source, probably due dynamically evaluated source code\.'\n?", re.M
)
_HIDDEN = re.compile(r"^\s*\[\.\.\. skipping hidden \d+ frames?\]\s*$")
_HEADER = re.compile(r"^\s*\S.*\s{2,}Traceback \(most recent call last\)\s*$")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")


@dataclass(frozen=True, slots=True)
class Trimmed:
    """A traceback for the model, and what was left out of it."""

    parts: list[str]
    left_out: int
    """Library frames left out, as the note line counts them (kernelbridge's own frames are left
    out too, uncounted: ``parts`` is the traceback as it came only if there were none of either)."""


def trim_traceback(parts: Sequence[str], *, notebook_hint: str = "the session's notebook") -> Trimmed:
    """``parts`` (IPython's structured traceback, without ANSI codes) with library frames before
    the raising frame of each exception left out, and one note line saying so; kernelbridge's own
    frames left out wherever they are."""
    kinds = [_kind(part) for part in parts]
    keep = [kind not in ("own", "hidden") for kind in kinds]
    left_out: list[int] = []
    # Each exception of a chain: the frames after its header, up to its last frame.
    for start, end in _sections(kinds):
        frames = [i for i in range(start, end) if kinds[i] in ("user", "library")]
        for i in frames[:-1]:
            if kinds[i] == "library":
                keep[i] = False
                left_out.append(i)
    if all(keep) and not any(_NO_SOURCE.search(part) for part in parts):
        return Trimmed(list(parts), 0)
    note = _note(parts, left_out, notebook_hint) if left_out else None
    kept_frames = [i for i in range(len(parts)) if keep[i] and kinds[i] in ("user", "library")]
    out: list[str] = []
    for i, part in enumerate(parts):
        if not keep[i]:
            continue
        if note is not None and kept_frames and i == kept_frames[-1]:
            out.append(note)
        out.append(_shown_frame(part, kinds[i]))
    return Trimmed(out, len(left_out))


def _note(parts: Sequence[str], left_out: list[int], notebook_hint: str) -> str:
    packages = list(dict.fromkeys(p for i in left_out if (p := _package(parts[i]))))
    which = f" ({', '.join(packages[:4])}{', ...' if len(packages) > 4 else ''})" if packages else ""
    count = len(left_out)
    return (
        f"[... {count} library frame{'s' * (count != 1)}{which} left out; the full traceback is in"
        f" {notebook_hint} ...]"
    )


def _kind(part: str) -> str:
    first = part.lstrip("\n").split("\n", 1)[0]
    if first.startswith("-" * 20):
        return "rule"
    if _HEADER.match(first):
        return "header"
    if any(marker in part for marker in _CHAIN) and len(part) < 200:
        return "chain"
    if _HIDDEN.match(part):
        return "hidden"
    if _CELL.match(first):
        return "user"
    match = _FILE.match(first)
    if match is not None:
        path = match["path"]
        if _OWN_PATH.search(path):
            return "own"
        return "library" if _LIBRARY_PATH.search(path) or _compiled(path, part) else "user"
    return "other"


def _sections(kinds: list[str]) -> list[tuple[int, int]]:
    """``(start, end)`` of each exception's parts: from after a header to the next chain part."""
    sections: list[tuple[int, int]] = []
    start = 0
    for i, kind in enumerate(kinds):
        if kind in ("header", "chain"):
            if i > start:
                sections.append((start, i))
            start = i + 1
    sections.append((start, len(kinds)))
    return sections


def _compiled(path: str, part: str) -> re.Match[str] | None:
    match = _COMPILED_PATH.match(path)
    if match is None or (match["ext"] == "py" and not _NO_SOURCE.search(part)):
        return None  # a relative .py with its source is the user's (compile(src, "pkg/x.py", ...))
    return match


def _package(part: str) -> str | None:
    first = part.lstrip("\n").split("\n", 1)[0]
    match = _FILE.match(first)
    compiled = _compiled(match["path"], part) if match is not None else None
    if compiled is not None:
        return compiled["package"]
    match = _PACKAGE.search(first)
    if match is None:
        return "the standard library" if _LIBRARY_PATH.search(first) else None
    return match["package"].split(".")[0]


def _shown_frame(part: str, kind: str) -> str:
    """A kept frame as the model reads it: without IPython's "Could not get source" line (a
    compiled or dynamically made frame), a library frame's long signature shortened."""
    part = _NO_SOURCE.sub("", part)
    if kind != "library":
        return part
    head, sep, rest = part.lstrip("\n").partition("\n")
    match = _FILE.match(head)
    if match is None or len(head) <= MAX_KEPT_SIGNATURE or not match["args"]:
        return part
    short = f"File {match['path']}:{match['line']}, in {match['name']}(...)"
    return short + sep + rest
