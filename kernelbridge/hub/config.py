"""Host MCP server configuration: which servers exist and how to reach them. No I/O but file reads.

:func:`load_catalog` reads every file :mod:`.sources` lists; a later definition of a name replaces
an earlier one whole (the entries' format and the variables each client's files expand: the
README's "Configuring host servers"). It never raises for bad input: a file or entry that cannot
be used is skipped, each file's problems one line in :attr:`ServerCatalog.problems`. An entry that
would launch kernelbridge itself is skipped (a bridge that calls itself would start sandboxes
without end): a problem in kernelbridge's own files, the normal case in a client's
(:attr:`ServerCatalog.itself`). Environment values and headers are secrets: kept out of ``repr``,
never sent to a sandbox or printed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from kernelbridge.config import Settings
from kernelbridge.hub.jsonread import JsonReadError, pick, read_json, read_jsonc
from kernelbridge.hub.sources import (
    ConfigSource,
    config_sources,
    display_path,
    home_of,
)

MAX_NAME_CHARS = 128
MAX_DESCRIPTION_CHARS = 2000
"""A server description is shown in docs for every call: long ones cost the model context."""
MAX_SHOWN_SKIPS = 5
"""Entries named in one file's problem line; more are counted."""
MAX_SERVERS_PER_FILE = 1000
"""Entries read from one file; a file with more is not a server list someone wrote."""

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
    """The file that defined it (for problems, doctor and ``kernelbridge servers``, never for sandboxes)."""
    origin: str = ""
    """Who wrote that file (``Claude Code (user)``, ``Cursor``, ``~/MCPs``...; see :mod:`.sources`)."""

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
    origin: str = ""

    @property
    def transport(self) -> Transport:
        return "http"


ServerConfig = StdioServer | HttpServer


@dataclass(frozen=True, slots=True)
class Shadowed:
    """A definition that a later (stronger) file replaced."""

    name: str
    source: Path
    origin: str
    by: Path
    """The file whose definition of ``name`` is used (the last that defines it, unless that one
    was replaced in turn)."""


@dataclass(frozen=True, slots=True)
class ServerCatalog:
    """The configured servers in configuration order, and one line per file with things skipped."""

    servers: dict[str, ServerConfig]
    problems: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()
    """Every file read (that exists, or was named explicitly), in order."""
    shadowed: tuple[Shadowed, ...] = ()
    itself: tuple[tuple[str, Path, str], ...] = ()
    """``(name, file, origin)`` of entries in MCP clients' files that launch kernelbridge itself
    (skipped quietly: that is how the client runs this bridge)."""


class _Skip(Exception):
    """An entry cannot be used; the message says why (one line)."""


class _Itself(_Skip):
    """The entry would launch kernelbridge itself."""


def config_files(settings: Settings, env: Mapping[str, str] | None = None) -> list[Path]:
    """The files that will be read, in precedence order (later wins): those that exist, and
    those named explicitly (a missing one is a problem). Each file once."""
    files: list[Path] = []
    for source in config_sources(settings, env):
        if source.path not in files and (source.explicit or source.path.is_file()):
            files.append(source.path)
    return files


def load_catalog(settings: Settings, env: Mapping[str, str] | None = None) -> ServerCatalog:
    """Read every config file. Never raises for bad input: problems are collected instead.

    Each file is read once, even when several sources share it (``~/.claude.json`` holds Claude
    Code's user scope and, later in the order, a project's local scope); each source's entries
    apply at its own place in the order, and each file's problems make one line.
    """
    env = os.environ if env is None else env
    home = home_of(env)
    ordered = config_sources(settings, env)
    by_file: dict[Path, list[ConfigSource]] = {}
    for source in ordered:
        if source.explicit or source.path.is_file():
            by_file.setdefault(source.path, []).append(source)
    read: dict[Path, dict[tuple[str, ...], dict[str, Any]]] = {}
    skipped: dict[Path, list[str]] = {path: [] for path in by_file}
    broken: dict[Path, str] = {}
    for path, sources in by_file.items():
        try:
            read[path] = _read_sources(sources)
        except _Skip as exc:
            broken[path] = str(exc)
    servers: dict[str, ServerConfig] = {}
    shadowed: list[Shadowed] = []
    itself: list[tuple[str, Path, str]] = []
    for source in ordered:
        entries = read.get(source.path, {}).get(source.key)
        if entries is None:
            continue
        expand = _expander(source, env, home)
        notes = skipped[source.path]
        for name, raw in list(entries.items())[:MAX_SERVERS_PER_FILE]:
            try:
                server = parse_entry(name, raw, source=source.path, origin=source.origin, expand=expand)
            except _Itself as exc:
                if source.client is not None:
                    itself.append((name, source.path, source.origin))
                else:
                    notes.append(f"server {_shown(name)}: {exc}")
                continue
            except _Skip as exc:
                notes.append(f"server {_shown(name)}: {exc}")
                continue
            if server is None:
                continue
            previous = servers.get(name)
            if previous is not None and previous.source is not None:
                shadowed.append(Shadowed(name, previous.source, previous.origin, source.path))
            servers[name] = server
        if len(entries) > MAX_SERVERS_PER_FILE:
            notes.append(
                f"{len(entries) - MAX_SERVERS_PER_FILE} entries past the first {MAX_SERVERS_PER_FILE}"
            )
    problems: list[str] = []
    for path in by_file:
        where = display_path(path, home)
        if path in broken:
            problems.append(f"{where}: {broken[path]}; file skipped")
        elif skipped[path]:
            problems.append(_problem_line(where, skipped[path]))
    return ServerCatalog(
        servers=servers,
        problems=tuple(problems),
        files=tuple(by_file),
        shadowed=tuple(shadowed),
        itself=tuple(itself),
    )


def _problem_line(where: str, skipped: list[str]) -> str:
    """One line for all of a file's skipped entries."""
    if len(skipped) == 1:
        return f"{where}: {skipped[0]}; skipped"
    shown = "; ".join(skipped[:MAX_SHOWN_SKIPS])
    more = f"; and {len(skipped) - MAX_SHOWN_SKIPS} more" if len(skipped) > MAX_SHOWN_SKIPS else ""
    return f"{where}: {len(skipped)} entries skipped: {shown}{more}"


def _read_sources(sources: list[ConfigSource]) -> dict[tuple[str, ...], dict[str, Any]]:
    """The entries of each source sharing one file, by key, read once. Raises _Skip for the file."""
    first = sources[0]
    try:
        if first.big:
            picked = pick(first.path, [s.key for s in sources], first.max_bytes)
            documents = [(s, picked.get(s.key)) for s in sources]
        else:
            document = (read_jsonc if first.jsonc else read_json)(first.path, first.max_bytes)
            if not isinstance(document, dict):
                want = " or ".join(dict.fromkeys(f'"{s.key[-1]}"' for s in sources))
                raise _Skip(f"expected a JSON object with {want}, found {_json_type(document)}")
            documents = [(s, _at(document, s.key)) for s in sources]
    except JsonReadError as exc:
        raise _Skip(str(exc)) from None
    found: dict[tuple[str, ...], dict[str, Any]] = {}
    for source, entries in documents:
        if entries is None and source.client is not None:
            continue  # a client's file holds other settings too: no servers there is normal
        if not isinstance(entries, dict):
            raise _Skip(f'no "{source.key[-1]}" object')
        found[source.key] = entries
    return found


def _at(document: dict[str, Any], key: tuple[str, ...]) -> object:
    value: object = document
    for part in key:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def parse_entry(
    name: str,
    raw: object,
    *,
    source: Path | None = None,
    origin: str = "",
    expand: Callable[[str], str] | None = None,
) -> ServerConfig | None:
    """One entry, or None when it is disabled. ``expand`` resolves the variables of the file's
    client in every string that reaches a server (it raises _Skip for one it cannot resolve).
    Raises _Skip with a reason (_Itself for an entry that would launch kernelbridge)."""
    if not name or len(name) > MAX_NAME_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise _Skip(f"a name must be 1 to {MAX_NAME_CHARS} printable characters")
    if not isinstance(raw, dict):
        raise _Skip(f"the entry must be an object, not {_json_type(raw)}")
    if raw.get("disabled") is True:
        return None
    ex: Callable[[str], str] = expand or (lambda text: text)
    description = _string(raw, "description", default="")[:MAX_DESCRIPTION_CHARS]
    kind = _transport(raw)
    if kind == "http":
        url = ex(_string(raw, "url"))
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Skip("'url' must be an http:// or https:// URL")
        headers = {key: ex(value) for key, value in _string_map(raw, "headers").items()}
        return HttpServer(name, url, headers, description, source, origin)
    command = ex(_string(raw, "command"))
    if not command.strip():
        raise _Skip("'command' is empty")
    args = [ex(arg) for arg in _string_list(raw, "args")]
    env = {key: ex(value) for key, value in _string_map(raw, "env").items()}
    for key in env:
        if not key or "=" in key:
            raise _Skip(f"'env' has an invalid variable name {key[:40]!r}")
    if raw.get("envFile") is not None:
        raise _Skip("'envFile' is not supported here: put the variables in 'env'")
    cwd = raw.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or "\0" in cwd):
        raise _Skip("'cwd' must be a string")
    if launches_kernelbridge(command, args):
        raise _Itself("it would launch kernelbridge itself (a bridge calling itself)")
    return StdioServer(
        name,
        os.path.expanduser(command),
        tuple(args),
        env,
        Path(ex(cwd)).expanduser() if cwd else None,
        description,
        source,
        origin,
    )


# -- variables, as each client expands them ------------------------------------------------------

_CLAUDE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_VSCODE_VAR = re.compile(r"\$\{([^}]{1,200})\}")


def _expander(source: ConfigSource, env: Mapping[str, str], home: Path) -> Callable[[str], str] | None:
    if source.expand == "claude":
        return lambda text: _expand_claude(text, env)
    if source.expand == "vscode":
        return lambda text: _expand_vscode(text, env, home, source.project)
    return None


def _expand_claude(text: str, env: Mapping[str, str]) -> str:
    """Claude Code's ``${VAR}`` and ``${VAR:-default}`` (it refuses an entry whose variable is unset)."""

    def one(match: re.Match[str]) -> str:
        value = env.get(match.group(1))
        if value is not None:
            return value
        if match.group(2) is not None:
            return match.group(2)
        raise _Skip(f"uses ${{{match.group(1)}}}, which is not set in kernelbridge's environment")

    return _CLAUDE_VAR.sub(one, text)


def _expand_vscode(text: str, env: Mapping[str, str], home: Path, project: Path | None) -> str:
    """VS Code's variables that mean the same outside VS Code; the others skip the entry."""

    def one(match: re.Match[str]) -> str:
        variable = match.group(1)
        if variable.startswith("env:"):
            return env.get(variable[4:], "")  # VS Code resolves an unset variable to ""
        if variable == "userHome":
            return str(home)
        if variable == "pathSeparator":
            return os.sep
        if variable in ("workspaceFolder", "workspaceRoot") and project is not None:
            return str(project)
        if variable == "workspaceFolderBasename" and project is not None:
            return project.name
        if variable.startswith("input:"):
            raise _Skip(
                f"uses ${{{variable[:60]}}}, which VS Code asks for when it starts the server;"
                " give the value in a kernelbridge config file (~/MCPs/*.json) instead"
            )
        raise _Skip(f"uses ${{{variable[:60]}}}, which only VS Code can resolve")

    return _VSCODE_VAR.sub(one, text)


OTHER_COMMANDS = frozenset(
    {"image", "doctor", "sessions", "attach", "export", "replay", "kernelspec", "setup", "skills", "demo",
     "servers", "--help", "-h", "--version"}
)  # fmt: skip
"""The ``kernelbridge`` commands that are not a bridge (``kernelbridge-mcp`` with none of them serves)."""
_OTHER = "|".join(re.escape(c) for c in sorted(OTHER_COMMANDS))
_SHELL_SELF = re.compile(
    r"(^|[\s/])kernelbridge(\s+\S+)*\s+serve\b|-m\s*kernelbridge\b"
    rf"|(^|[\s/])kernelbridge-mcp(?![\w.-])(?!\S*\s+({_OTHER})(\s|$))"
)
_SCRIPT = re.compile(r"kernelbridge([=@\[<>~!].*)?")
_MCP_SCRIPT = re.compile(r"kernelbridge-mcp([=@\[<>~!].*)?")


def launches_kernelbridge(command: str, args: list[str] | tuple[str, ...]) -> bool:
    """Whether ``command args`` would run a bridge: ``kernelbridge serve`` (directly, via a
    launcher such as ``uvx``/``pipx run``, as ``python -m kernelbridge``, or inside a ``sh -c``
    string), or the distribution's own script ``kernelbridge-mcp`` (which serves unless it is
    given another command: ``uvx kernelbridge-mcp``)."""
    tokens = [command, *args]
    for i, token in enumerate(tokens):
        base = os.path.basename(token)
        if _SCRIPT.fullmatch(base) and "serve" in tokens[i + 1 :]:
            return True
        if _MCP_SCRIPT.fullmatch(base) and (i == 0 or tokens[i - 1] not in ("--from", "--spec", "--with")):
            command_word = next((t for t in tokens[i + 1 :] if t in OTHER_COMMANDS or t == "serve"), "serve")
            if command_word == "serve":
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
