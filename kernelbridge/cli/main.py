"""The ``kernelbridge`` command line's parser and entry point. Each subcommand is a thin shell over
one layer's API (the groups are the modules beside this one; see :mod:`kernelbridge.cli`).

Failures print one line ``kernelbridge: <reason>`` on stderr and exit non-zero; tracebacks are
for bugs only (and then they are a bug).
"""

from __future__ import annotations

import argparse
import os
import sys

from kernelbridge import __version__
from kernelbridge.cli import (
    demo,
    doctor,
    history,
    image,
    kernelspec,
    lab,
    replay,
    serve,
    servers,
    sessions,
    setup,
    skills,
)
from kernelbridge.cli.command import Command
from kernelbridge.config import check_state_dir, load_settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.lazy import skip_unused_imports

GROUPS = (serve, servers, image, doctor, sessions, history, lab, replay, kernelspec, setup, skills, demo)
"""The command groups, in the order ``kernelbridge --help`` lists their commands."""

STATEFUL = frozenset({"serve", "replay", "demo", "setup"})
"""Commands that write to the state directory."""
LENIENT = frozenset({"serve", "doctor"})
"""Commands that start with bad settings (kept in ``Settings.problems``): ``serve`` over stdio
says them at every call (an MCP client shows none of its stderr), ``doctor`` lists them; every
other command stops with the first, in one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelbridge", description="A stateful, sandboxed Python for AI agents, served over MCP."
    )
    parser.add_argument("--version", action="version", version=f"kernelbridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


def _first_error(group: BaseExceptionGroup[BaseException]) -> KernelBridgeError | None:
    for exc in group.exceptions:
        if isinstance(exc, KernelBridgeError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (found := _first_error(exc)) is not None:
            return found
    return None


def main(argv: list[str] | None = None) -> int:
    skip_unused_imports()
    args = build_parser().parse_args(argv)
    run: Command = args.run
    try:
        settings = load_settings(strict=args.command not in LENIENT)
        if args.command in STATEFUL - LENIENT:
            check_state_dir(settings)  # one line now, not a traceback from deep inside
        return run(args, settings)
    except KernelBridgeError as exc:
        print(f"kernelbridge: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        # A failure inside a task group (e.g. the server's lifespan) arrives wrapped: still one line.
        found = _first_error(group)
        if found is None:
            raise
        print(f"kernelbridge: {found}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kernelbridge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `kernelbridge doctor | head -1`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141


SERVE_DEFAULT_EXCEPT = frozenset({"-h", "--help", "--version"})


def serve_main(argv: list[str] | None = None) -> int:
    """The ``kernelbridge-mcp`` script: ``kernelbridge`` with ``serve`` when no command is given
    (``kernelbridge-mcp``, ``kernelbridge-mcp --http``); with a command, that command."""
    args = sys.argv[1:] if argv is None else argv
    if not args or (args[0].startswith("-") and args[0] not in SERVE_DEFAULT_EXCEPT):
        args = ["serve", *args]
    return main(args)


if __name__ == "__main__":
    sys.exit(main())
