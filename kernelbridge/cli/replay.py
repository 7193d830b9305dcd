"""``kernelbridge replay``: a notebook re-run in a fresh sandbox, every cell judged against its
recorded behaviour."""

from __future__ import annotations

import argparse
import sys
import warnings
from functools import partial
from typing import TYPE_CHECKING

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import ConfigError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    replay = sub.add_parser("replay", help="re-run a notebook in a fresh sandbox and judge every cell")
    replay.add_argument("notebook")
    replay.add_argument("-o", "--output", help="write the replayed notebook here")
    replay.add_argument("--strict", action="store_true", help="also fail when an output differs")
    replay.add_argument("--grant", action="append", default=[], metavar="SERVER",
                        help="call this configured host server live (repeatable); every other host "
                             "call is answered from the notebook's recording")  # fmt: skip
    replay.add_argument("--recorded-tools", action="store_true",
                        help="answer host tool calls from the recording (the default)")  # fmt: skip
    replay.set_defaults(run=cmd_replay)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    """Exit status: 0 every cell behaved as recorded (cells the original never ran are run, and
    reported ``unexecuted``), 1 a cell raised that did not before, a cell the original never ran
    raised now (as ``jupyter nbconvert --execute`` fails), or, with --strict, an output differs;
    or no sandbox may start (limits not enforced, no image: one line); 2 the input is not a
    notebook.

    A notebook may come from anywhere: no live host server is called unless the person names it
    with ``--grant`` (``--recorded-tools``, once needed for that, is the default and a no-op)."""
    from kernelbridge.replay import read_notebook, replay_notebook

    try:
        read_notebook(args.notebook)  # bad input is one line and status 2, before any sandbox
    except ConfigError as exc:
        print(f"kernelbridge: {exc}", file=sys.stderr)
        return 2
    run = partial(replay_notebook, grant=tuple(args.grant))
    with warnings.catch_warnings():
        # Third parties' warnings (nbformat, jupyter_client, pyzmq) are not the report's business:
        # what the notebook had that a replay cannot use, the report says in its own lines.
        warnings.simplefilter("ignore")
        report = anyio.run(run, settings, args.notebook, args.output)
    print(report.text())
    if args.output:
        print(f"wrote {args.output}")
    return 1 if report.failed(strict=args.strict) else 0
