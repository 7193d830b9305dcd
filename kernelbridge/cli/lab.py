"""``kernelbridge lab``: JupyterLab on the agent's live sessions (``kernelbridge.lab``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    lab = sub.add_parser(
        "lab",
        help="JupyterLab on 127.0.0.1 in which every live session is a kernel "
        "(pip install 'kernelbridge-mcp[lab]')",
    )
    lab.add_argument(
        "--port", type=int, help="the loopback port (default: Jupyter's, 8888 or the next free one)"
    )
    lab.add_argument(
        "--token",
        metavar="NAME",
        help="show only the sessions of this HTTP token (its name in KERNELBRIDGE_HTTP_TOKENS); "
        "default: your own (stdio's)",
    )
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")
    lab.add_argument("--allow-root", action="store_true", help="run as root (Jupyter refuses by default)")
    lab.set_defaults(run=cmd_lab)


def cmd_lab(args: argparse.Namespace, settings: Settings) -> int:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        raise KernelBridgeError(
            "kernelbridge lab needs JupyterLab: pip install 'kernelbridge-mcp[lab]' (or jupyterlab)"
        ) from None
    from kernelbridge.lab.app import LabOptions, run_lab
    from kernelbridge.lab.listing import lab_namespace
    from kernelbridge.notebook.journal import journal_read_limit

    namespace = lab_namespace(settings, args.token)
    options = LabOptions(
        state_dir=settings.state_dir,
        namespace=namespace,
        journal_limit=journal_read_limit(settings),
        port=args.port,
        open_browser=not args.no_browser,
        allow_root=args.allow_root,
    )
    run_lab(options)
    return 0
