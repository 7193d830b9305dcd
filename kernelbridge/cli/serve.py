"""``kernelbridge serve``: the MCP server over stdio, or streamable HTTP with ``--http``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from kernelbridge.cli.servers import add_discovery_arguments, with_discovery
from kernelbridge.config import (
    Settings,
    check_mount_set,
    check_state_dir,
    mount_guard_of,
    parse_mounts,
    problems_line,
    with_problem,
)
from kernelbridge.errors import ConfigError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    serve.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="HOST",
                       help="a Host name HTTP clients use (repeatable; needed off loopback)")  # fmt: skip
    serve.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    serve.add_argument("--no-auth", action="store_true",
                       help="no bearer tokens (loopback only; any local user may run code)")  # fmt: skip
    add_discovery_arguments(serve)
    serve.add_argument("--mount", action="append", default=[], metavar="SRC:DST",
                       help="a host directory every sandbox sees read-only at DST (repeatable;"
                            " beside KERNELBRIDGE_MOUNTS)")  # fmt: skip
    serve.set_defaults(run=cmd_serve)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.cli.history import warn_if_over_budget
    from kernelbridge.image import contents_from_settings
    from kernelbridge.lazy import uncollected

    with uncollected():  # the MCP SDK and the server: most of a bridge's start
        from kernelbridge.server import serve
        from kernelbridge.server.http import HttpOptions

    settings = with_discovery(args, settings)
    # A bad value is kept, not raised: over stdio the bridge must start and say it at every call
    # (an MCP client shows none of its stderr); `--http` refuses to start instead (see below).
    try:
        if args.mount:
            guard = mount_guard_of(settings)
            mounts = [parse_mounts(item, guard, where="--mount")[0] for item in args.mount]
            combined = check_mount_set([*settings.mounts, *mounts], where="--mount")
            settings = dataclasses.replace(settings, mounts=combined)
    except ConfigError as exc:
        settings = with_problem(settings, str(exc))
    try:
        contents_from_settings(settings)  # the image's extra packages
    except ConfigError as exc:
        settings = with_problem(settings, str(exc))
    if args.http:  # an operator's terminal: one line and exit 1
        if settings.problems:
            raise ConfigError(problems_line(settings.problems))
        check_state_dir(settings)  # before the token file is read from it
    if not settings.problems:
        warn_if_over_budget(settings)  # old session generations are never removed silently
    http = None
    if args.http:
        http = HttpOptions.from_args(
            settings,
            host=args.host,
            port=args.port,
            allowed_hosts=args.allowed_host,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            auth=not args.no_auth,
        )
    elif args.no_auth or args.allowed_host or args.tls_cert or args.tls_key:
        raise ConfigError("--no-auth, --allowed-host and --tls-* only apply with --http")
    serve(settings, http=http)
    return 0
