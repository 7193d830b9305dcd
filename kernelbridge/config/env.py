"""One ``KERNELBRIDGE_*`` variable at a time: looked up (with the predecessor's ``MCP_BRIDGE_*``
name as a fallback), parsed and checked, a bad value a ConfigError that names the variable, the
value and what is expected. Used by :func:`kernelbridge.config.load_settings`. No I/O.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from kernelbridge.errors import ConfigError

T = TypeVar("T", bound=str)

_SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)


def variables(name: str, *aliases: str) -> tuple[str, ...]:
    """The variables setting ``name`` is read from, strongest first: ``KERNELBRIDGE_<name>``, the
    predecessor's ``MCP_BRIDGE_<name>``, then the same for each of ``aliases``."""
    return tuple(prefix + each for each in (name, *aliases) for prefix in ("KERNELBRIDGE_", "MCP_BRIDGE_"))


def find(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of ``names`` set to something other than blanks, and its value stripped."""
    for var in names:
        value = env.get(var)
        if value is not None and value.strip() != "":
            return var, value.strip()
    return None


def lookup(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    return find(env, variables(name))


# Each parser below takes the variable found and its value and raises ConfigError for a bad one.
# None of them knows a default: an unset variable leaves its setting at the record's default.


def text(var: str, raw: str) -> str:
    return raw


def number(var: str, raw: str, *, minimum: float, integer: bool) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{var}={raw!r} is not {kind}") from None
    if value < minimum:
        raise ConfigError(f"{var}={raw!r} must be at least {minimum:g}")
    return value


def choice(var: str, raw: str, choices: tuple[T, ...]) -> T:
    """One of ``choices`` (the variable's value, case-insensitive)."""
    for value in choices:
        if raw.lower() == value:
            return value
    raise ConfigError(f"{var}={raw!r}: expected {' or '.join(map(str, choices))}")


def size(var: str, raw: str) -> str:
    if not _SIZE.match(raw):
        raise ConfigError(f"{var}={raw!r} is not a size such as 512m or 1g")
    return raw.lower()


def names(var: str, raw: str, *, dotted: bool = False) -> tuple[str, ...]:
    """A comma-separated list of names or fnmatch patterns; ``dotted`` requires ``server.tool``."""
    items = tuple(item.strip() for item in raw.split(",") if item.strip())
    for item in items:
        if dotted and "." not in item and item != "*":
            raise ConfigError(f"{var}: {item!r} is not a server.tool pattern (e.g. github.delete_*)")
    return items


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def labels(var: str, raw: str) -> tuple[tuple[str, str], ...]:
    labels = []
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        if (
            not sep
            or not _LABEL_KEY.match(key)
            or (key.startswith("kernelbridge.") and key in _RESERVED_LABELS)
        ):
            raise ConfigError(f"{var}: {item!r} is not a key=value label (or uses a reserved key)")
        labels.append((key, value))
    return tuple(labels)


_RESERVED_LABELS = frozenset({"kernelbridge.session", "kernelbridge.owner", "kernelbridge.host"})


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def byte_size(var: str, raw: str, *, minimum: int) -> int:
    """A size in bytes: a number, or a number with k, m or g (binary units)."""
    raw = size(var, raw)
    unit = raw[-1] if raw[-1].isalpha() else ""
    value = int(float(raw[: len(raw) - len(unit)]) * _UNITS[unit])
    if value < minimum:
        raise ConfigError(f"{var}={raw!r} must be at least {minimum // 1024} KiB")
    return value


# Between two requirements: spaces, or a comma before the next name ("polars>=1,<2" stays one).
_REQUIREMENT_SEPARATOR = re.compile(r"\s+|,\s*(?=[A-Za-z0-9])")


def requirements(var: str, raw: str) -> tuple[str, ...]:
    """Python package requirements separated by spaces or commas (checked by the image module)."""
    return tuple(item for item in _REQUIREMENT_SEPARATOR.split(raw) if item)


def path(var: str, raw: str) -> Path:
    return Path(raw).expanduser()


def paths(var: str, raw: str) -> tuple[Path, ...]:
    """Paths separated like ``PATH`` (``os.pathsep``)."""
    return tuple(Path(p).expanduser() for p in raw.split(os.pathsep))


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(var: str, raw: str) -> bool:
    if raw.lower() not in _TRUE + _FALSE:
        raise ConfigError(f"{var}={raw!r}: expected 1 or 0")
    return raw.lower() in _TRUE


def ssh_command(var: str, raw: str) -> tuple[str, ...]:
    try:
        words = tuple(shlex.split(raw))
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is not a command line: {exc}") from None
    if not words:
        raise ConfigError(f"{var} is empty")
    return words
