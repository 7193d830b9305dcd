"""``kernelbridge demo``: the command of :mod:`kernelbridge.demo` (a short scripted agent session,
printed as a transcript)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kernelbridge.config import Settings

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    demo = sub.add_parser("demo", help="run a short scripted agent session and print it as a transcript")
    demo.set_defaults(run=cmd_demo)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.demo import main as demo_main

    return demo_main()
