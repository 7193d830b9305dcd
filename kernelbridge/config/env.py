"""One ``KERNELBRIDGE_*`` variable at a time: looked up (with the predecessor's ``MCP_BRIDGE_*``
name as a fallback), parsed and checked, a bad value a ConfigError that names the variable, the
value and what is expected. Used by :func:`kernelbridge.config.load_settings`. No I/O.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from kernelbridge.errors import ConfigError

_SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)


def lookup(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for prefix in ("KERNELBRIDGE_", "MCP_BRIDGE_"):
        value = env.get(prefix + name)
        if value is not None and value.strip() != "":
            return prefix + name, value.strip()
    return None


def number(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float,
    integer: bool,
    aliases: tuple[str, ...] = (),
) -> float:
    found = lookup(env, name) or next(filter(None, (lookup(env, alias) for alias in aliases)), None)
    if found is None:
        return default
    var, raw = found
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{var}={raw!r} is not {kind}") from None
    if value < minimum:
        raise ConfigError(f"{var}={raw!r} must be at least {minimum:g}")
    return value


def size(env: Mapping[str, str], name: str, default: str) -> str:
    found = lookup(env, name)
    if found is None:
        return default
    var, raw = found
    if not _SIZE.match(raw):
        raise ConfigError(f"{var}={raw!r} is not a size such as 512m or 1g")
    return raw.lower()


def names(env: Mapping[str, str], name: str, *, dotted: bool = False) -> tuple[str, ...]:
    """A comma-separated list of names or fnmatch patterns; ``dotted`` requires ``server.tool``."""
    found = lookup(env, name)
    if found is None:
        return ()
    var, raw = found
    items = tuple(item.strip() for item in raw.split(",") if item.strip())
    for item in items:
        if dotted and "." not in item and item != "*":
            raise ConfigError(f"{var}: {item!r} is not a server.tool pattern (e.g. github.delete_*)")
    return items


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def labels(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    found = lookup(env, "LABELS")
    if found is None:
        return ()
    var, raw = found
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


def byte_size(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    """A size in bytes: a number, or a number with k, m or g (binary units)."""
    found = lookup(env, name)
    raw = size(env, name, "")
    if found is None or not raw:
        return default
    unit = raw[-1] if raw[-1].isalpha() else ""
    value = int(float(raw[: len(raw) - len(unit)]) * _UNITS[unit])
    if value < minimum:
        raise ConfigError(f"{found[0]}={raw!r} must be at least {minimum // 1024} KiB")
    return value


# Between two requirements: spaces, or a comma before the next name ("polars>=1,<2" stays one).
_REQUIREMENT_SEPARATOR = re.compile(r"\s+|,\s*(?=[A-Za-z0-9])")


def requirements(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Python package requirements separated by spaces or commas (checked by the image module)."""
    found = lookup(env, name)
    if found is None:
        return ()
    return tuple(item for item in _REQUIREMENT_SEPARATOR.split(found[1]) if item)


def path(env: Mapping[str, str], name: str) -> Path | None:
    found = lookup(env, name)
    return Path(found[1]).expanduser() if found else None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    found = lookup(env, name)
    if found is None:
        return default
    var, raw = found
    if raw.lower() not in _TRUE + _FALSE:
        raise ConfigError(f"{var}={raw!r}: expected 1 or 0")
    return raw.lower() in _TRUE


def ssh_command(env: Mapping[str, str]) -> tuple[str, ...]:
    found = lookup(env, "SSH_COMMAND")
    if found is None:
        return ("ssh",)
    var, raw = found
    try:
        words = tuple(shlex.split(raw))
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is not a command line: {exc}") from None
    if not words:
        raise ConfigError(f"{var} is empty")
    return words
