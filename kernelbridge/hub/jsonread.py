"""Reading the JSON that MCP clients write, bounded: plain files, VS Code's JSONC, and one value
picked out of a big document without parsing the rest. No policy here, only reading.

Every reader raises :class:`JsonReadError` with a one-line reason. :func:`read_jsonc` blanks
comments and trailing commas instead of removing them, so an error's line and column are the file's.
:func:`pick` (e.g. ``("projects", "/home/me/p", "mcpServers")`` of ``~/.claude.json``) decodes only
the wanted values, each at most :data:`MAX_PICKED_BYTES`; what it jumps over is not validated.
Design: docs/design/host.md.
"""

from __future__ import annotations

import json
import mmap
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_PICKED_BYTES = 1024 * 1024
"""A picked value (one ``mcpServers`` object) larger than this is not a server list."""
MAX_DEPTH = 64
"""Nesting :func:`pick` follows while skipping; deeper documents are refused, not recursed into."""


class JsonReadError(Exception):
    """The document cannot be used; the message says why in one line."""


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, at most ``max_bytes``. Raises JsonReadError (missing, unreadable, too big)."""
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise JsonReadError("no such file") from None
    except OSError as exc:
        raise JsonReadError(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > max_bytes:
        raise JsonReadError(f"larger than {_size(max_bytes)}")
    return data


def read_json(path: Path, max_bytes: int) -> object:
    """The parsed document. Raises JsonReadError."""
    return _loads(read_bytes(path, max_bytes))


def read_jsonc(path: Path, max_bytes: int) -> object:
    """The parsed document, comments and trailing commas allowed (VS Code). Raises JsonReadError."""
    data = read_bytes(path, max_bytes)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise JsonReadError("not valid JSON (not UTF-8)") from None
    return _loads(strip_jsonc(text))


# A string (kept), a comment (blanked), or a comma followed by blanks and a closing bracket (the
# comma blanked). One pass of alternatives: a `//` inside a string is part of the string.
_STRING_TEXT = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_COMMENT = re.compile(_STRING_TEXT + r"|//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_TRAILING_COMMA = re.compile(_STRING_TEXT + r"|,(?=\s*[}\]])")


def strip_jsonc(text: str) -> str:
    """JSONC as JSON of the same length and lines: comments and trailing commas become spaces."""

    def blank(match: re.Match[str]) -> str:
        found = match.group(0)
        if found.startswith('"'):
            return found
        return re.sub(r"[^\n]", " ", found)

    return _TRAILING_COMMA.sub(blank, _COMMENT.sub(blank, text))


def _loads(data: bytes | str) -> object:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise JsonReadError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError):  # not UTF-8, nested past the interpreter's limit
        raise JsonReadError("not valid JSON") from None


# -- picking values out of a big document ----------------------------------------------------------

_WS = re.compile(rb"[ \t\r\n]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_PLAIN = re.compile(rb'(?:[^"{}\[\]]+|"[^"\\]*(?:\\.[^"\\]*)*")*')
"""Everything up to the next bracket, strings included (a bracket in a string is not one):
scalars, strings, commas, colons and blanks, jumped by one match."""
_SCALAR = re.compile(rb"[^,}\]\s]+")


def pick(path: Path, wanted: Sequence[tuple[str, ...]], max_bytes: int) -> dict[tuple[str, ...], Any]:
    """The values found at the ``wanted`` key paths of the document at ``path`` (absent paths are
    left out). The document's root must be an object. Raises JsonReadError."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise JsonReadError(f"larger than {_size(max_bytes)}")
            if size == 0:
                raise JsonReadError("not valid JSON (the file is empty)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Picker(data, wanted).run()
    except FileNotFoundError:
        raise JsonReadError("no such file") from None
    except OSError as exc:
        raise JsonReadError(f"cannot be read ({exc.strerror or type(exc).__name__})") from None


class _Picker:
    def __init__(self, data: mmap.mmap, wanted: Sequence[tuple[str, ...]]) -> None:
        self.data = data
        self.wanted = [tuple(w) for w in wanted]
        self.found: dict[tuple[str, ...], Any] = {}

    def run(self) -> dict[tuple[str, ...], Any]:
        pos = self._ws(0)
        if pos < len(self.data) and self.data[pos : pos + 3] == b"\xef\xbb\xbf":  # a UTF-8 BOM
            pos = self._ws(pos + 3)
        if self.data[pos : pos + 1] != b"{":
            raise JsonReadError("expected a JSON object at the top")
        self._object(pos, ())
        return self.found

    def _fail(self, pos: int, what: str) -> JsonReadError:
        line = self.data[:pos].count(b"\n") + 1 if pos < 16 * 1024 * 1024 else None
        where = f"line {line}" if line is not None else f"byte {pos}"
        return JsonReadError(f"not valid JSON ({where}: {what})")

    def _ws(self, pos: int) -> int:
        match = _WS.match(self.data, pos)
        assert match is not None  # `*` always matches
        return match.end()

    def _object(self, pos: int, prefix: tuple[str, ...]) -> int:
        """Walk the object starting at ``pos`` (its ``{``), whose key path is ``prefix``; return
        the position after its ``}``. Members on a wanted path are followed or decoded."""
        pos = self._ws(pos + 1)
        if self.data[pos : pos + 1] == b"}":
            return pos + 1
        while True:
            string = _STRING.match(self.data, pos)
            if string is None:
                raise self._fail(pos, "expected a member name")
            try:
                key = json.loads(string.group(0))
            except ValueError:
                raise self._fail(pos, "a member name is not a valid string") from None
            pos = self._ws(string.end())
            if self.data[pos : pos + 1] != b":":
                raise self._fail(pos, "expected ':'")
            pos = self._ws(pos + 1)
            path = (*prefix, key)
            if path in self.wanted:
                end = self._skip(pos, len(path))
                if end - pos > MAX_PICKED_BYTES:
                    raise JsonReadError(f"{'.'.join(path)[:80]} is larger than {_size(MAX_PICKED_BYTES)}")
                self.found[path] = _loads(bytes(self.data[pos:end]))
                pos = end
            elif any(w[: len(path)] == path for w in self.wanted) and self.data[pos : pos + 1] == b"{":
                pos = self._object(pos, path)
            else:
                pos = self._skip(pos, len(path))
            pos = self._ws(pos)
            following = self.data[pos : pos + 1]
            if following == b"}":
                return pos + 1
            if following != b",":
                raise self._fail(pos, "expected ',' or '}'")
            pos = self._ws(pos + 1)

    def _skip(self, pos: int, depth: int) -> int:
        """The position after the value starting at ``pos``, without decoding it."""
        first = self.data[pos : pos + 1]
        if first == b'"':
            string = _STRING.match(self.data, pos)
            if string is None:
                raise self._fail(pos, "unterminated string")
            return string.end()
        if first not in (b"{", b"["):
            scalar = _SCALAR.match(self.data, pos)
            if scalar is None:
                raise self._fail(pos, "expected a value")
            return scalar.end()
        stack = [first]
        pos += 1
        while stack:
            if len(stack) + depth > MAX_DEPTH:
                raise JsonReadError(f"nested deeper than {MAX_DEPTH} levels")
            plain = _PLAIN.match(self.data, pos)
            assert plain is not None
            pos = plain.end()
            char = self.data[pos : pos + 1]
            if not char:
                raise self._fail(pos, "the document ends inside a value")
            if char == b'"':
                string = _STRING.match(self.data, pos)
                if string is None:
                    raise self._fail(pos, "unterminated string")
                pos = string.end()
                continue
            if char in (b"{", b"["):
                stack.append(char)
            elif (stack.pop(), char) not in ((b"{", b"}"), (b"[", b"]")):
                raise self._fail(pos, "mismatched bracket")
            pos += 1
        return pos


def _size(n: int) -> str:
    mib = 1024 * 1024
    return f"{n // mib} MiB" if n >= 16 * mib and n % mib == 0 else f"{n // 1024} KiB"
