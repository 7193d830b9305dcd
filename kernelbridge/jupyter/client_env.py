"""What a Jupyter client may tell its sandbox about itself: who the person is, how their terminal shows text.

Nothing else of the host crosses. The person (:func:`real_username`) is the Jupyter session's
``username``, or the operating system user running the bridge where that is jupyter_client's
placeholder ``username``. Display settings (:func:`display_env`) are only the names of
:data:`DISPLAY_VARIABLES`, exactly, each whole value matched against its own pattern and bounded,
else left out as if unset; :func:`terminal_size` stands in for an unset ``COLUMNS`` and ``LINES``.
No I/O beyond that question to a file descriptor. Design: docs/design/host.md.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping

JUPYTER_DEFAULT_USERNAME = "username"
"""jupyter_client's ``Session.username`` when ``$USER`` is unset: no one's name."""
MAX_USERNAME = 64

MAX_TERMINAL = 10_000
"""Columns or lines a sandbox is told of (a real terminal has a few hundred)."""
MAX_VALUE = 256
"""Characters of a value looked at at all (each pattern allows fewer): a megabyte-long ``TERM``
is refused before a pattern runs over it."""
_LOCALE_NAME = r"(?:C|POSIX|[a-z]{2,8}(?:_[A-Z]{2}|_[0-9]{3})?)(?:\.[A-Za-z0-9-]{1,16})?(?:@[a-z0-9]{1,16})?"
"""A locale as POSIX spells it: language[_territory][.codeset][@modifier], or C / POSIX."""
_NUMBER = re.compile(r"[1-9][0-9]{0,4}")
_TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}")
"""A terminfo name (xterm-256color, screen.xterm-256color, rxvt-unicode)."""
_LOCALE = re.compile(_LOCALE_NAME)
_LANGUAGE = re.compile(rf"{_LOCALE_NAME}(?::{_LOCALE_NAME}){{0,7}}")
"""GNU's LANGUAGE: up to eight locales, separated by colons (de_DE:de:en)."""
_FLAG = re.compile(r"[A-Za-z0-9]{1,16}")

DISPLAY_VARIABLES: dict[str, re.Pattern[str]] = {
    "COLUMNS": _NUMBER,
    "LINES": _NUMBER,
    "TERM": _TERM,
    "COLORTERM": _FLAG,
    "LANG": _LOCALE,
    "LC_ALL": _LOCALE,
    "LC_CTYPE": _LOCALE,
    "LC_MESSAGES": _LOCALE,
    "LC_NUMERIC": _LOCALE,
    "LC_TIME": _LOCALE,
    "LANGUAGE": _LANGUAGE,
    "NO_COLOR": _FLAG,
    "FORCE_COLOR": _FLAG,
    "CLICOLOR": _FLAG,
    "CLICOLOR_FORCE": _FLAG,
}
"""The client's settings a sandbox kernel gets, each with the pattern its whole value must match
(``fullmatch``: a ``$`` would let a trailing newline through): how text is laid out and rendered,
nothing that names a path, a host, a program or a secret (not ``PAGER``, ``EDITOR``,
``MPLBACKEND``, ``TZ``, ``TERMINFO``...). Names are looked up exactly: ``LC_ALL_X`` or ``TERM ``
are other variables, never taken."""
Env = tuple[tuple[str, str], ...]
"""Variables for a container (``ContainerSpec.env``)."""


def display_env(environ: Mapping[str, str], *, terminal: tuple[int, int] | None = None) -> Env:
    """The allowed display settings of a client's ``environ`` (see the module docstring), with
    ``COLUMNS`` and ``LINES`` from the client's ``terminal`` (columns, lines) where the environment
    has none: what a sandbox kernel's container gets."""
    chosen: dict[str, str] = {}
    for name, pattern in DISPLAY_VARIABLES.items():
        value = environ.get(name)
        if isinstance(value, str) and len(value) <= MAX_VALUE and pattern.fullmatch(value):
            chosen[name] = value
    for name in ("COLUMNS", "LINES"):
        if name in chosen and int(chosen[name]) > MAX_TERMINAL:
            del chosen[name]
    if terminal is not None:
        columns, lines = terminal
        if "COLUMNS" not in chosen and 0 < columns <= MAX_TERMINAL:
            chosen["COLUMNS"] = str(columns)
        if "LINES" not in chosen and 0 < lines <= MAX_TERMINAL:
            chosen["LINES"] = str(lines)
    return tuple(sorted(chosen.items()))


def terminal_size(fd: int) -> tuple[int, int] | None:
    """The size of the terminal on ``fd`` (the client process's stdout), or None if it is none."""
    try:
        size = os.get_terminal_size(fd)
    except (OSError, ValueError):
        return None
    return size.columns, size.lines


def os_username() -> str:
    """The name of the operating system user running this process (its uid's, not ``$USER``)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name[:MAX_USERNAME]
    except KeyError:
        return f"uid {os.getuid()}"


def real_username(claimed: str) -> str:
    """Who sent a client's cell: its session's username when it names someone, else the bridge's
    operating system user (see the module docstring)."""
    claimed = claimed.strip()[:MAX_USERNAME]
    if not claimed or claimed == JUPYTER_DEFAULT_USERNAME or not claimed.isprintable():
        return os_username()
    return claimed
