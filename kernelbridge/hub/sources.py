"""Where host MCP server definitions are found, in precedence order (weakest first).

:func:`config_sources` lists the places and reads no file (:mod:`.config` does): the files of the
user's MCP clients (``KERNELBRIDGE_CLIENT_CONFIGS``), a project's only when one is named (a cloned
repository could otherwise name the commands a bridge runs), then ``~/MCPs/*.json``,
``~/.config/mcp/servers/*.json``, ``KERNELBRIDGE_SERVERS_CONFIG`` and ``--servers-config``, last
and strongest. Every path, per client and system: the README's "Configuring host servers".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kernelbridge.config import CLIENTS, Settings

MAX_CONFIG_BYTES = 1024 * 1024
"""A config file larger than this is not a config file (and must not make the bridge read a log)."""
MAX_CLAUDE_JSON_BYTES = 256 * 1024 * 1024
"""``~/.claude.json`` keeps project histories (tens of MiB are common); it is mapped and walked,
not parsed whole (see :mod:`.jsonread`), so this bounds only the time spent walking it."""

Expansion = Literal["none", "claude", "vscode"]
"""Which variables a client expands in its entries: Claude Code ``${VAR}`` and ``${VAR:-default}``;
VS Code ``${env:VAR}``, ``${userHome}``, ``${workspaceFolder}`` (``${input:...}`` only it can ask for)."""


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """One place server entries may come from."""

    path: Path
    origin: str
    """Who writes it, as ``kernelbridge servers`` shows it (``Claude Code (user)``, ``Cursor``, ...)."""
    key: tuple[str, ...] = ("mcpServers",)
    """Where the entries are in the document."""
    client: str | None = None
    """The MCP client whose file this is (one of :data:`~kernelbridge.config.CLIENTS`), or None for
    kernelbridge's own files. A client's file may lack the key (it holds other settings too) and
    may hold kernelbridge's own entry: both are normal there, not problems."""
    jsonc: bool = False
    big: bool = False
    """Read with :func:`.jsonread.pick` (``~/.claude.json``)."""
    expand: Expansion = "none"
    explicit: bool = False
    """Named by the operator: a missing file is a problem."""
    project: Path | None = None
    """The project a project-scope file belongs to (``${workspaceFolder}``)."""

    @property
    def max_bytes(self) -> int:
        return MAX_CLAUDE_JSON_BYTES if self.big else MAX_CONFIG_BYTES


def config_sources(settings: Settings, env: Mapping[str, str] | None = None) -> list[ConfigSource]:
    """Every place to look, weakest first (the README's order). Default directories
    are globbed now; missing client files are listed too (reading them finds nothing)."""
    env = os.environ if env is None else env
    home = home_of(env)
    config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    # Where Electron apps keep settings: ~/.config on Linux, ~/Library/Application Support on macOS.
    app_config = home / "Library" / "Application Support" if sys.platform == "darwin" else config_home
    clients = set(settings.client_configs)
    sources: list[ConfigSource] = []
    claude_json = Path(env["CLAUDE_CONFIG_DIR"]) / ".claude.json" if env.get("CLAUDE_CONFIG_DIR") else None
    claude_json = claude_json or home / ".claude.json"
    if "claude-code" in clients:
        sources.append(
            ConfigSource(claude_json, "Claude Code (user)", client="claude-code", big=True, expand="claude")
        )
    if "claude-desktop" in clients:
        sources.append(
            ConfigSource(
                app_config / "Claude" / "claude_desktop_config.json",
                "Claude Desktop",
                client="claude-desktop",
            )
        )
    if "cursor" in clients:
        sources.append(ConfigSource(home / ".cursor" / "mcp.json", "Cursor", client="cursor"))
    if "vscode" in clients:
        for product in ("Code", "Code - Insiders", "VSCodium"):
            sources.append(
                ConfigSource(
                    app_config / product / "User" / "mcp.json",
                    "VS Code",
                    key=("servers",),
                    client="vscode",
                    jsonc=True,
                    expand="vscode",
                )
            )
    if settings.project is not None:
        sources.extend(project_sources(settings.project, clients, claude_json))
    for directory, origin in (
        (home / "MCPs", "~/MCPs"),
        (home / ".config" / "mcp" / "servers", "~/.config/mcp"),
    ):
        sources.extend(ConfigSource(path, origin) for path in json_files(directory))
    for path in settings.servers_config:
        if path.is_dir():
            sources.extend(ConfigSource(p, "--servers-config", explicit=True) for p in json_files(path))
        else:
            sources.append(ConfigSource(path, "--servers-config", explicit=True))
    return sources


def project_sources(project: Path, clients: set[str], claude_json: Path) -> list[ConfigSource]:
    """A project's files (step 5), weakest first: Claude Code's local scope wins over its project
    scope, as in Claude Code itself."""
    project = project.expanduser().absolute()
    found: list[ConfigSource] = []
    if "vscode" in clients:
        found.append(
            ConfigSource(
                project / ".vscode" / "mcp.json",
                "VS Code (project)",
                key=("servers",),
                client="vscode",
                jsonc=True,
                expand="vscode",
                project=project,
            )
        )
    if "cursor" in clients:
        found.append(
            ConfigSource(
                project / ".cursor" / "mcp.json", "Cursor (project)", client="cursor", project=project
            )
        )
    if "claude-code" in clients:
        found.append(
            ConfigSource(
                project / ".mcp.json",
                "Claude Code (project)",
                client="claude-code",
                expand="claude",
                project=project,
            )
        )
        # Claude Code keys projects by the directory it was started in, as it spelled it.
        for spelling in _unique(project, project.resolve()):
            found.append(
                ConfigSource(
                    claude_json,
                    "Claude Code (local)",
                    key=("projects", str(spelling), "mcpServers"),
                    client="claude-code",
                    big=True,
                    expand="claude",
                    project=project,
                )
            )
    return found


def home_of(env: Mapping[str, str] | None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("HOME") or os.path.expanduser("~"))


def json_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.glob("*.json") if p.is_file())
    except OSError:
        return []


def display_path(path: Path, home: Path) -> str:
    """``path`` with the home directory shown as ``~`` (for one-line problems)."""
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)


def _unique(*paths: Path) -> list[Path]:
    seen: list[Path] = []
    for path in paths:
        if path not in seen:
            seen.append(path)
    return seen


__all__ = ["CLIENTS", "ConfigSource", "config_sources", "display_path", "home_of", "json_files"]
