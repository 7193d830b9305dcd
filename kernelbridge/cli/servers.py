"""``kernelbridge servers``: the host MCP servers a bridge would offer, and where each was found.

It reads the same files, in the same order, as ``serve`` (:mod:`kernelbridge.hub.sources`) and
starts nothing. Shown: names, aliases, transports and sources; what the operator's settings deny
or want approved; definitions a stronger file replaced; kernelbridge's own entries in the clients'
files (skipped); one line per file with problems. Never a command line, an environment, a URL or
a header: they may hold credentials.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelbridge.config import Settings

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands
    from kernelbridge.hub import ServerCatalog


def add_parsers(sub: Subcommands) -> None:
    servers = sub.add_parser("servers", help="list the host MCP servers found, and where")
    servers.add_argument("--json", action="store_true", help="machine-readable output")
    add_discovery_arguments(servers)
    servers.set_defaults(run=cmd_servers)


def add_discovery_arguments(parser: argparse.ArgumentParser) -> None:
    """``--servers-config`` and ``--project``, shared with ``serve`` (so both see the same servers)."""
    parser.add_argument(
        "--servers-config",
        action="append",
        default=[],
        metavar="FILE",
        help="host MCP servers config file or directory (repeatable; strongest)",
    )
    parser.add_argument(
        "--project", metavar="DIR", help="also read this project's .mcp.json, .cursor/ and .vscode/ files"
    )


def with_discovery(args: argparse.Namespace, settings: Settings) -> Settings:
    """``settings`` with the command line's ``--servers-config`` (after the variable's) and ``--project``."""
    if args.servers_config:
        extra = tuple(Path(p).expanduser() for p in args.servers_config)
        settings = dataclasses.replace(settings, servers_config=settings.servers_config + extra)
    if args.project:
        settings = dataclasses.replace(settings, project=Path(args.project).expanduser().absolute())
    return settings


def cmd_servers(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.hub import load_catalog

    settings = with_discovery(args, settings)
    catalog = load_catalog(settings)
    report = servers_report(catalog, settings)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for line in report_lines(report):
            print(line)
    return 0


def servers_report(
    catalog: ServerCatalog, settings: Settings, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What ``kernelbridge servers`` shows, as JSON-able data (names, transports, sources only)."""
    from kernelbridge.hub import Policy, assign_aliases
    from kernelbridge.hub.sources import config_sources, display_path, home_of

    home = home_of(env)
    policy = Policy.from_settings(settings)
    aliases = assign_aliases(catalog.servers)
    servers = []
    for name, server in catalog.servers.items():
        record: dict[str, Any] = {
            "name": name,
            "alias": aliases[name],
            "transport": server.transport,
            "source": display_path(server.source, home) if server.source else None,
            "origin": server.origin,
            "allowed": policy.server_allowed(name),
        }
        if not record["allowed"]:
            record["denied_by"] = policy.why_denied(name)
        if patterns := policy.approval_patterns(name):
            record["approval"] = patterns
        servers.append(record)
    return {
        "servers": servers,
        "replaced": [
            {
                "name": s.name,
                "source": display_path(s.source, home),
                "origin": s.origin,
                "by": display_path(s.by, home),
            }
            for s in catalog.shadowed
        ],
        "itself": [
            {"name": name, "source": display_path(path, home), "origin": origin}
            for name, path, origin in catalog.itself
        ],
        "problems": list(catalog.problems),
        "files": [display_path(path, home) for path in catalog.files],
        "searched": [
            *dict.fromkeys(display_path(s.path, home) for s in config_sources(settings, env)),
            "~/MCPs/*.json",
            "~/.config/mcp/servers/*.json",
        ],
        "project": str(settings.project) if settings.project else None,
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    servers = report["servers"]
    lines: list[str] = []
    if servers:
        width = max(4, *(len(s["name"]) for s in servers))
        lines.append(f"{'NAME':<{width}}  {'TRANSPORT':<9}  SOURCE")
        for s in servers:
            notes = []
            if not s["allowed"]:
                notes.append(f"denied by {s['denied_by']}")
            if s.get("approval"):
                notes.append(f"calls matching {', '.join(s['approval'])} need approval")
            note = f"  [{'; '.join(notes)}]" if notes else ""
            lines.append(f"{s['name']:<{width}}  {s['transport']:<9}  {s['source']} ({s['origin']}){note}")
    else:
        lines.append(f"no host MCP servers found; looked in {', '.join(dict.fromkeys(report['searched']))}")
    for r in report["replaced"]:
        lines.append(f"replaced: {r['name']} of {r['source']} ({r['origin']}), by {r['by']}")
    for r in report["itself"]:
        lines.append(f"skipped:  {r['name']} of {r['source']} ({r['origin']}) launches kernelbridge itself")
    lines.extend(f"problem:  {problem}" for problem in report["problems"])
    if report["project"] is None:
        lines.append("(project files such as .mcp.json are read only with --project DIR)")
    return lines
