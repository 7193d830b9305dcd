"""``kernelbridge kernelspec install``: the Jupyter kernelspec whose kernels are sandboxes."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands
    from kernelbridge.runtime import RuntimeInfo

RUNTIME_INFO_TIMEOUT = 30.0
"""Bound on asking the runtime whether it enforces limits (a CLI call, well under a second here)."""


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
    """Install the kernelspec with the settings this host needs (``setup``'s entry's: the
    ``KERNELBRIDGE_*`` and engine variables of this command's environment, the image's profile
    and extra packages, ``KERNELBRIDGE_ALLOW_UNLIMITED`` where the runtime cannot enforce limits)."""
    from kernelbridge.cli.setup import entry_env, settings_for_host
    from kernelbridge.image import contents_from_settings
    from kernelbridge.jupyter.kernelspec import install_kernelspec, visibility_note

    info = anyio.run(runtime_info, settings)
    settings, why = settings_for_host(settings, info)
    if why:
        print(f"kernelspec: {why}: its kernels start with it")
    env = entry_env(settings, contents_from_settings(settings))
    prefix = sys.prefix if args.sys_prefix else args.prefix
    path = install_kernelspec(user=prefix is None, prefix=prefix, env=env)
    print(f"installed the kernelbridge kernelspec in {path}")
    if env:
        print(f"its kernels start with {', '.join(sorted(env))} as set here (install again to change them)")
    print("use it with: jupyter console --kernel kernelbridge (or pick it in JupyterLab)")
    print(visibility_note(path))
    return 0


async def runtime_info(settings: Settings) -> RuntimeInfo | None:
    """What the selected runtime says of itself, or None when it does not answer (the kernelspec
    is installed all the same: its kernels will say what is missing)."""
    from kernelbridge.jupyter.provisioner import single_use
    from kernelbridge.runtime import open_runtime

    try:
        with anyio.fail_after(RUNTIME_INFO_TIMEOUT):
            async with open_runtime(single_use(settings)) as runtime:
                return await runtime.info()
    except (KernelBridgeError, TimeoutError):
        return None
