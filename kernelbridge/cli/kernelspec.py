"""``kernelbridge kernelspec install``: the Jupyter kernelspec whose kernels are sandboxes."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kernelbridge.config import Settings

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    spec = sub.add_parser("kernelspec", help="manage the `kernelbridge` Jupyter kernelspec")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True, metavar="ACTION")
    install = spec_sub.add_parser("install", help="install the kernelspec (for this user by default)")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (the default)")
    where.add_argument("--sys-prefix", action="store_true", help="into this Python environment (sys.prefix)")
    where.add_argument("--prefix", help="into this prefix (PREFIX/share/jupyter/kernels)")
    spec.set_defaults(run=cmd_kernelspec)


def cmd_kernelspec(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.jupyter.kernelspec import install_kernelspec, visibility_note

    prefix = sys.prefix if args.sys_prefix else args.prefix
    path = install_kernelspec(user=prefix is None, prefix=prefix)
    print(f"installed the kernelbridge kernelspec in {path}")
    print("use it with: jupyter console --kernel kernelbridge (or pick it in JupyterLab)")
    print(visibility_note(path))
    return 0
