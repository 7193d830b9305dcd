"""``kernelbridge sessions --all`` and ``kernelbridge prune``: every generation of every session on
this state directory, and removing the oldest old ones, explicitly (nothing else ever does).

``KERNELBRIDGE_HISTORY_BUDGET`` is what old generations may take; past it the listing (and every
bridge start, :func:`warn_if_over_budget`) says so, and ``prune`` brings them back within it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    prune = sub.add_parser(
        "prune", help="remove the oldest old session generations until they fit KERNELBRIDGE_HISTORY_BUDGET"
    )
    keep = "what old generations may keep (64m, 1g, 0: none; default: the setting)"
    prune.add_argument("--budget", metavar="SIZE", help=keep)
    prune.add_argument("--session", metavar="NAME", help="only this session's generations")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    prune.set_defaults(run=cmd_prune)


def show_generations(settings: Settings, *, as_json: bool) -> int:
    from kernelbridge.session.generations import history_bytes, history_over_budget, list_generations

    generations = list_generations(settings.state_dir)
    if as_json:
        print(json.dumps([g.listing() for g in generations], indent=2))
        return 0
    if not generations:
        print("no sessions")
        return 0
    print(f"{'SESSION@GENERATION':<32} {'STATE':<9} {'BEGAN':<16} {'SIZE':>10}  CURRENT")
    for g in generations:
        began = time.strftime("%Y-%m-%d %H:%M", time.localtime(g.began))
        print(f"{g.name:<32} {g.state:<9} {began:<16} {_size(g.bytes):>10}  {'yes' if g.current else ''}")
    used = history_bytes(generations)
    budget = _size(settings.history_budget)
    print(f"old generations take {_size(used)} of {budget} (KERNELBRIDGE_HISTORY_BUDGET)")
    if (over := history_over_budget(settings.state_dir, settings.history_budget)) is not None:
        print(over)
    return 0


def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.config import load_settings
    from kernelbridge.session.generations import prune

    budget = settings.history_budget
    if args.budget is not None:
        budget = load_settings({"KERNELBRIDGE_HISTORY_BUDGET": args.budget}).history_budget
    removed = prune(settings.state_dir, budget, dry_run=args.dry_run, session=args.session)
    verb = "would remove" if args.dry_run else "removed"
    for g in removed:
        print(f"{verb} {g.name} ({g.state}, {_size(g.bytes)})")
    freed = sum(g.bytes for g in removed)
    print(f"{verb} {len(removed)} generation(s), {_size(freed)}; old generations may keep {_size(budget)}")
    return 0


def warn_if_over_budget(settings: Settings) -> None:
    """One line on stderr (the bridge's log) when old generations take more than their budget."""
    from kernelbridge.session.generations import history_over_budget

    try:
        over = history_over_budget(settings.state_dir, settings.history_budget)
    except (OSError, ConfigError):
        return
    if over is not None:
        print(f"kernelbridge: {over}", file=sys.stderr)


def _size(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size / 1024:,.1f} KiB"
