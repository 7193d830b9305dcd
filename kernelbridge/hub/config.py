"""Host MCP server configuration: which servers exist and how to reach them. No I/O but file reads.

Files hold ``{"mcpServers": {name: entry}}`` as Claude Desktop, Cursor and other MCP clients
write them. They are read in this order, and **a later definition of a name replaces an earlier
one** (whole entries, never merged; the name keeps its first position, which orders aliases):

1. ``~/MCPs/*.json`` (sorted by file name)
2. ``~/.config/mcp/servers/*.json`` (sorted by file name)
3. each path of ``Settings.servers_config`` in order (``--servers-config`` after
   ``KERNELBRIDGE_SERVERS_CONFIG``); a directory there means its ``*.json`` files, sorted.

``~`` is the ``HOME`` of the environment given (``os.environ`` by default).

Entries:

- stdio: ``command`` (required), ``args`` (list of strings), ``env`` (object of strings, added to
  the host's environment), ``cwd``, ``description``;
- remote, streamable HTTP: ``url`` (http or https), ``headers`` (object of strings), ``description``;
- ``type`` (or ``transport``) may say ``stdio``, ``http``, ``streamable-http`` or ``streamableHttp``;
  without it, ``url`` means HTTP and ``command`` means stdio. ``sse`` is not supported.
- ``"disabled": true`` skips an entry quietly; unknown keys (``autoApprove``, ...) are ignored.

A file or entry that cannot be used is skipped and described by one line in
:attr:`ServerCatalog.problems`; everything else still loads. An entry that would launch
kernelbridge itself (``kernelbridge serve``, ``python -m kernelbridge``, ...) is skipped with a
note there too: a bridge that calls itself would start sandboxes without end.

Environment values and headers are secrets: they are kept out of ``repr`` and never put in
anything sent to a sandbox (see :mod:`kernelbridge.hub.docs`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from kernelbridge.config import Settings

MAX_CONFIG_BYTES = 1024 * 1024
"""A config file larger than this is not a config file (and must not make the bridge read a log)."""
MAX_NAME_CHARS = 128
MAX_DESCRIPTION_CHARS = 2000
"""A server description is shown in docs for every call: long ones cost the model context."""

Transport = Literal["stdio", "http"]
_TYPES: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "streamablehttp": "http",
}


@dataclass(frozen=True, slots=True)
class StdioServer:
    """A server run as a child process speaking MCP on its stdin/stdout."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Added to the host's environment for the child; secret: never leaves the hub."""
    cwd: Path | None = None
    description: str = ""
    source: Path | None = None
    """The file that defined it (for problems and doctor, never for sandboxes)."""

    @property
    def transport(self) -> Transport:
        return "stdio"


@dataclass(frozen=True, slots=True)
class HttpServer:
    """A remote server reached over streamable HTTP."""

    name: str
    url: str = field(repr=False)
    """May carry credentials (userinfo, a token in the query): never leaves the hub."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Secret (e.g. ``Authorization``): never leaves the hub."""
    description: str = ""
    source: Path | None = None

    @property
    def transport(self) -> Transport:
        return "http"


ServerConfig = StdioServer | HttpServer


@dataclass(frozen=True, slots=True)
class ServerCatalog:
    """The configured servers in configuration order, and one line per thing skipped."""

    servers: dict[str, ServerConfig]
    problems: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()
    """Every file read, in order."""


class _Skip(Exception):
    """An entry cannot be used; the message says why (one line)."""


def config_files(settings: Settings, env: Mapping[str, str] | None = None) -> list[Path]:
    """The files to read, in precedence order (later wins). Missing default directories are fine."""
    home = _home(env)
    files: list[Path] = []
    for directory in (home / "MCPs", home / ".config" / "mcp" / "servers"):
        files.extend(_json_files(directory))
    for path in settings.servers_config:
        files.extend(_json_files(path) if path.is_dir() else [path])
    return files


def load_catalog(settings: Settings, env: Mapping[str, str] | None = None) -> ServerCatalog:
    """Read every config file. Never raises for bad input: problems are collected instead."""
    home = _home(env)
    servers: dict[str, ServerConfig] = {}
    problems: list[str] = []
    files = config_files(settings, env)
    for path in files:
        where = display_path(path, home)
        try:
            entries = _read_entries(path)
        except _Skip as exc:
            problems.append(f"{where}: {exc}; file skipped")
            continue
        for name, raw in entries.items():
            try:
                server = parse_entry(name, raw, source=path)
            except _Skip as exc:
                problems.append(f"{where}: server {_shown(name)}: {exc}; skipped")
                continue
            if server is not None:
                servers[name] = server
    return ServerCatalog(servers=servers, problems=tuple(problems), files=tuple(files))


def parse_entry(name: str, raw: object, *, source: Path | None = None) -> ServerConfig | None:
    """One ``mcpServers`` entry, or None when it is disabled. Raises _Skip with a reason."""
    if not name or len(name) > MAX_NAME_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise _Skip(f"a name must be 1 to {MAX_NAME_CHARS} printable characters")
    if not isinstance(raw, dict):
        raise _Skip(f"the entry must be an object, not {_json_type(raw)}")
    if raw.get("disabled") is True:
        return None
    description = _string(raw, "description", default="")[:MAX_DESCRIPTION_CHARS]
    kind = _transport(raw)
    if kind == "http":
        url = _string(raw, "url")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Skip("'url' must be an http:// or https:// URL")
        headers = _string_map(raw, "headers")
        return HttpServer(name, url, headers, description, source)
    command = _string(raw, "command")
    if not command.strip():
        raise _Skip("'command' is empty")
    args = _string_list(raw, "args")
    env = _string_map(raw, "env")
    for key in env:
        if not key or "=" in key:
            raise _Skip(f"'env' has an invalid variable name {key[:40]!r}")
    cwd = raw.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or "\0" in cwd):
        raise _Skip("'cwd' must be a string")
    if launches_kernelbridge(command, args):
        raise _Skip("it would launch kernelbridge itself (a bridge calling itself)")
    return StdioServer(
        name,
        os.path.expanduser(command),
        tuple(args),
        env,
        Path(cwd).expanduser() if cwd else None,
        description,
        source,
    )


_SHELL_SELF = re.compile(r"(^|[\s/])kernelbridge(\s+\S+)*\s+serve\b|-m\s*kernelbridge\b")


def launches_kernelbridge(command: str, args: list[str] | tuple[str, ...]) -> bool:
    """Whether ``command args`` would run ``kernelbridge serve`` (directly, via a launcher such as
    ``uvx``/``pipx run``, as ``python -m kernelbridge``, or inside a ``sh -c`` string)."""
    tokens = [command, *args]
    for i, token in enumerate(tokens):
        base = os.path.basename(token)
        if re.fullmatch(r"kernelbridge([=@\[<>~!].*)?", base) and "serve" in tokens[i + 1 :]:
            return True
        if token == "-m" and i + 1 < len(tokens) and _is_self_module(tokens[i + 1]):
            return True
        if token.startswith("-m") and _is_self_module(token[2:]):
            return True
        if any(c.isspace() for c in token) and _SHELL_SELF.search(token):
            return True
    return False


def _is_self_module(module: str) -> bool:
    return module == "kernelbridge" or module.startswith("kernelbridge.")


def display_path(path: Path, home: Path) -> str:
    """``path`` with the home directory shown as ``~`` (for one-line problems)."""
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)


def _home(env: Mapping[str, str] | None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("HOME") or os.path.expanduser("~"))


def _json_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.glob("*.json") if p.is_file())
    except OSError:
        return []


def _read_entries(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise _Skip("no such file") from None
    except OSError as exc:
        raise _Skip(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _Skip(f"larger than {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        document = json.loads(data)
    except json.JSONDecodeError as exc:
        raise _Skip(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError):
        raise _Skip("not valid JSON") from None
    if not isinstance(document, dict):
        raise _Skip(f'expected a JSON object with "mcpServers", found {_json_type(document)}')
    servers = document.get("mcpServers")
    if not isinstance(servers, dict):
        raise _Skip('no "mcpServers" object')
    return servers


def _transport(raw: dict[str, Any]) -> Transport:
    given = raw.get("type", raw.get("transport"))
    if given is not None:
        if not isinstance(given, str):
            raise _Skip("'type' must be a string")
        kind = _TYPES.get(given.lower())
        if kind is None:
            if given.lower() == "sse":
                raise _Skip("'type': 'sse' (the deprecated HTTP+SSE transport) is not supported")
            raise _Skip(f"unknown 'type' {given[:40]!r} (expected stdio or http)")
        return kind
    if "url" in raw and "command" in raw:
        raise _Skip('has both \'command\' and \'url\'; add "type": "stdio" or "http"')
    if "url" in raw:
        return "http"
    if "command" in raw:
        return "stdio"
    raise _Skip("needs a 'command' (stdio) or a 'url' (streamable HTTP)")


def _string(raw: dict[str, Any], key: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if value is None:
        raise _Skip(f"'{key}' is missing")
    if not isinstance(value, str) or "\0" in value:
        raise _Skip(f"'{key}' must be a string, not {_json_type(value)}")
    return value


def _string_list(raw: dict[str, Any], key: str) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise _Skip(f"'{key}' must be a list of strings")
    return value


def _string_map(raw: dict[str, Any], key: str) -> dict[str, str]:
    value = raw.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(v, str) and "\0" not in v and "\0" not in k for k, v in value.items()
    ):
        # Never echo the values: they are secrets.
        raise _Skip(f"'{key}' must be an object whose values are strings")
    return dict(value)


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _shown(name: str) -> str:
    return repr(name[:60] + ("..." if len(name) > 60 else ""))
