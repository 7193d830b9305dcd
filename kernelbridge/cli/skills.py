"""``kernelbridge skills list|show|rm``: a person reviews the tools sandboxed code saved.

Saved tools live in ``<state_dir>/skills`` and, for each HTTP token, in
``<state_dir>/http/<namespace>/skills`` (shown as ``namespace/tool``); sandboxes use them only by
importing them, so a person reviews them here (source as saved, byte for byte)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from kernelbridge.config import Settings
from kernelbridge.errors import SkillError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    skills = sub.add_parser(
        "skills", help="review the tools sandboxed code saved with save_tool() (a token's as NAMESPACE/NAME)"
    )
    skills_sub = skills.add_subparsers(dest="skills_command", required=True, metavar="ACTION")
    skills_list = skills_sub.add_parser("list", help="list the saved tools")
    skills_list.add_argument("--json", action="store_true", help="machine-readable output")
    skills_show = skills_sub.add_parser("show", help="print a saved tool's source")
    skills_show.add_argument("name")
    skills_rm = skills_sub.add_parser("rm", help="delete saved tools")
    skills_rm.add_argument("names", nargs="+", metavar="NAME")
    skills.set_defaults(run=cmd_skills)


def cmd_skills(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.hub.skills import list_every_skill, locate, read_skill, remove_skill

    if args.skills_command == "list":
        infos = list_every_skill(settings.state_dir)
        if args.json:
            print(json.dumps([dataclasses.asdict(i) for i in infos], indent=2))
        elif not infos:
            print("no saved tools")
        else:
            width = max(24, *(len(info.name) + 1 for info in infos))
            print(f"{'NAME':<{width}} {'SAVED (UTC)':<21} DESCRIPTION")
            for info in infos:
                line = (info.description.strip().splitlines() or [""])[0][:80]
                print(f"{info.name:<{width}} {info.saved_at:<21} {line}")
        return 0
    if args.skills_command == "show":
        source = read_skill(*locate(settings.state_dir, args.name)).source
        print(source, end="" if source.endswith("\n") else "\n")
        return 0
    missing = [name for name in args.names if not remove_skill(*locate(settings.state_dir, name))]
    for name in args.names:
        if name not in missing:
            print(f"removed {name}")
    if missing:
        raise SkillError(f"no saved tool named {missing[0]!r} (see `kernelbridge skills list`)")
    return 0
