"""Text as a cell's outputs keep it: bounded, without terminal codes, overwritten as a terminal would.

- :class:`BoundedText`: append-only text that keeps a head and a tail (and counts what it cut);
- :class:`StreamText`: a stream output's text with carriage returns applied, as Jupyter saves
  it (:func:`overwrite`), bounded the same way;
- :func:`strip_ansi`, :func:`cut_middle`: text as a model reads it.
"""

from __future__ import annotations

import re
from collections import deque

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# nbclient's _RGX_CARRIAGERETURN, nbconvert's CoalesceStreamsPreprocessor's CR_PAT.
_CARRIAGE_RETURN = re.compile(r".*\r(?=[^\n])")


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


def overwrite(line: str) -> str:
    """One line of stream text as Jupyter saves it: the part before a carriage return that is
    followed by more text is gone (nbclient's and nbconvert's rule; it never crosses a newline, so
    applying it line by line equals applying it to the whole text). Backspaces are kept as written,
    as nbclient and nbconvert keep them (nbclient's backspace rule never runs)."""
    return _CARRIAGE_RETURN.sub("", line) if "\r" in line else line


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


class StreamText:
    """The text of one stream output as Jupyter keeps it (:func:`overwrite` line by line), bounded.

    Complete lines go into a :class:`BoundedText` already overwritten; the line being written stays
    raw until its newline comes (a later ``\\r`` may still change it), and is compacted
    whenever it passes the limit (a progress bar redrawing one line for hours)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lines = BoundedText(limit)
        self.line = ""

    def append(self, text: str) -> None:
        if not text:
            return
        if "\n" not in text:
            self.line += text
        else:
            first, *middle, last = text.split("\n")
            self.lines.append(overwrite(self.line + first) + "\n")
            for line in middle:
                self.lines.append(overwrite(line) + "\n")
            self.line = last
        if len(self.line) > self.limit:
            self.line = overwrite(self.line)
            if len(self.line) > self.limit:  # one line longer than the limit: keep its head and tail
                self.lines.append(self.line)
                self.line = ""

    @property
    def cut(self) -> int:
        return self.lines.cut

    def render(self, what: str) -> str:
        return self.lines.render(what) + overwrite(self.line)

    def last_lines(self, n: int) -> str:
        current = overwrite(self.line)
        done = self.lines.last_lines(n)
        return "\n".join([line for line in (done, current) if line][-n:]) if current else done
