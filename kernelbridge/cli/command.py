"""What every command group of the ``kernelbridge`` command line shares: the type of a command's
handler and of the sub-parsers a group adds its commands to.

A group module (``serve``, ``image``, ``sessions``, ...) has one ``add_parsers(sub)`` that adds its
commands with ``set_defaults(run=handler)``; :mod:`kernelbridge.cli.main` builds the parser from the
groups and calls the handler. Handlers import the layers they drive inside their bodies, so that
building the parser (every command does) stays a matter of milliseconds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from kernelbridge.config import Settings

Command: TypeAlias = Callable[[argparse.Namespace, Settings], int]
"""A command's handler: the parsed arguments and the settings in, the process exit status out.
A failure the user can act on is raised as a KernelBridgeError (main prints it as one line)."""

if TYPE_CHECKING:
    # argparse's sub-parsers action is generic only in typeshed, not at run time.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
