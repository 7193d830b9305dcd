"""The ``kernelbridge`` command line. Each subcommand is a thin shell over one layer's API.

Failures print one line ``kernelbridge: <reason>`` on stderr and exit non-zero; tracebacks are
for bugs only (and then they are a bug).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import anyio

from kernelbridge import __version__
from kernelbridge.config import Settings, check_state_dir, load_settings
from kernelbridge.errors import ConfigError, KernelBridgeError, SessionError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelbridge", description="A stateful, sandboxed Python for AI agents, served over MCP."
    )
    parser.add_argument("--version", action="version", version=f"kernelbridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    serve.add_argument("--servers-config", action="append", default=[], metavar="FILE",
                       help="host MCP servers config file (repeatable)")  # fmt: skip

    image = sub.add_parser("image", help="manage the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    build = image_sub.add_parser("build", help="build the sandbox image (no container registry needed)")
    build.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    build.add_argument("--containerfile", action="store_true",
                       help="build from sandbox_kernel_image/Containerfile (needs a registry)")  # fmt: skip
    build.add_argument("--with", dest="packages", action="append", default=[], metavar="PACKAGE",
                       help="add a Python package to the image (repeatable)")  # fmt: skip
    image_sub.add_parser("status", help="say whether the image is current, stale or missing")

    sub.add_parser("doctor", help="check the runtime, limits, image and a kernel start")

    sessions = sub.add_parser("sessions", help="list live sessions")
    sessions.add_argument("--json", action="store_true", help="machine-readable output")

    attach = sub.add_parser("attach", help="open `jupyter console --existing` on a live session")
    attach.add_argument("session")
    attach.add_argument("--print", action="store_true", help="only print the connection file path")

    export = sub.add_parser("export", help="export a session's journal as a notebook")
    export.add_argument("session")
    export.add_argument("-o", "--output", required=True, help="output .ipynb path")

    replay = sub.add_parser("replay", help="re-run a notebook in a fresh sandbox and judge every cell")
    replay.add_argument("notebook")
    replay.add_argument("-o", "--output", help="write the replayed notebook here")
    replay.add_argument("--strict", action="store_true", help="also fail when an output differs")
    replay.add_argument("--grant", action="append", default=[], metavar="SERVER",
                        help="call this configured host server live (repeatable); every other host "
                             "call is answered from the notebook's recording")  # fmt: skip
    replay.add_argument("--recorded-tools", action="store_true",
                        help="answer host tool calls from the recording (the default)")  # fmt: skip

    spec = sub.add_parser("kernelspec", help="manage the `kernelbridge` Jupyter kernelspec")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True, metavar="ACTION")
    install = spec_sub.add_parser("install", help="install the kernelspec (for this user by default)")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (the default)")
    where.add_argument("--sys-prefix", action="store_true", help="into this Python environment (sys.prefix)")
    where.add_argument("--prefix", help="into this prefix (PREFIX/share/jupyter/kernels)")

    setup = sub.add_parser("setup", help="check this machine, build the sandbox image, run doctor")
    setup.add_argument("--with", dest="packages", action="append", default=[], metavar="PACKAGE",
                       help="add a Python package to the image (repeatable)")  # fmt: skip

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

    sub.add_parser("demo", help="run a short scripted agent session and print it as a transcript")
    return parser


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.image import extras_from_settings
    from kernelbridge.server import serve
    from kernelbridge.server.http import HttpOptions

    if args.servers_config:
        extra = tuple(Path(p).expanduser() for p in args.servers_config)
        settings = dataclasses.replace(settings, servers_config=settings.servers_config + extra)
    extras_from_settings(settings)  # a bad package list stops the start, with one line
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


def cmd_image(args: argparse.Namespace, settings: Settings) -> int:
    """``image status`` / ``image build``, in the image store of the selected runtime (the one
    ``serve`` would use: local, remote or several engines)."""
    return anyio.run(_image, args, settings)


async def _image(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.image import (
        agent_hash,
        build_image,
        check_labels,
        default_image,
        extras_from_settings,
        image_status,
    )
    from kernelbridge.runtime import open_runtime

    extras = extras_from_settings(settings)
    wanted = extras.plus(args.packages) if args.image_command == "build" else extras
    async with open_runtime(settings) as runtime:
        if args.image_command == "status":
            if settings.image:  # used as given: only its agent matters (raises ImageError if wrong)
                check_labels(settings.image, await runtime.images.labels(settings.image), agent_hash())
                print(f"{settings.image}: usable (KERNELBRIDGE_IMAGE)")
                return 0
            image = default_image(extras)
            status = await image_status(runtime.images, image, extras)
            print(f"{image}: {status}")
            return 0 if status == "current" else 1
        tag = await build_image(
            runtime.images, force=args.force, containerfile=args.containerfile, extras=wanted
        )
    if settings.image:
        print(f"note: KERNELBRIDGE_IMAGE={settings.image} is set, so bridges use that image, not {tag}")
    elif wanted != extras:
        # The bridge finds the image by the configured packages: say how to configure them.
        packages = " ".join(wanted.requirements)
        print(f"to use it, give `kernelbridge serve` KERNELBRIDGE_IMAGE_PACKAGES={shlex.quote(packages)}")
    return 0


def cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.host_setup import run_setup

    return run_setup(settings, packages=args.packages)


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.doctor import run_doctor

    return anyio.run(run_doctor, settings)


def cmd_sessions(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.session.store import list_session_records

    records = list_session_records(settings.state_dir)
    if args.json:
        print(json.dumps(records, indent=2, default=str))
        return 0
    if not records:
        print("no live sessions")
        return 0
    print(f"{'SESSION':<20} {'CONTAINER':<36} {'OWNER':>7}  CONNECTION FILE")
    for r in records:
        container, owner = r.get("container") or "-", r.get("owner_pid", "-")
        print(f"{r['name']:<20} {container:<36} {owner:>7}  {r['connection_file']}")
    return 0


def find_session(settings: Settings, name: str) -> dict:
    from kernelbridge.session.store import list_session_records

    for record in list_session_records(settings.state_dir):
        if record["name"] == name:
            return record
    raise SessionError(f"no live session named {name!r} (see `kernelbridge sessions`)")


def cmd_attach(args: argparse.Namespace, settings: Settings) -> int:
    connection_file = find_session(settings, args.session)["connection_file"]
    if args.print:
        print(connection_file)
        return 0
    # Beside our own interpreter first: the venv's bin directory need not be on PATH.
    beside = Path(sys.executable).with_name("jupyter-console")
    console = str(beside) if beside.exists() else shutil.which("jupyter-console")
    if console is None:
        raise KernelBridgeError("jupyter console is not installed (pip install jupyter-console)")
    argv = [console, "--existing", connection_file]
    if not sys.stdin.isatty():  # scripted input: prompt_toolkit needs a terminal
        argv.append("--simple-prompt")
    os.execv(console, argv)
    return 0  # not reached


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.session.store import export_session

    path = export_session(settings, args.session, args.output)
    print(f"wrote {path}")
    return 0


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    """Exit status: 0 every cell behaved as recorded, 1 a cell raised that did not before (or,
    with --strict, an output differs), 2 the input is not a notebook.

    A notebook may come from anywhere: no live host server is called unless the person names it
    with ``--grant`` (``--recorded-tools``, once needed for that, is the default and a no-op)."""
    from functools import partial

    from kernelbridge.errors import ConfigError
    from kernelbridge.notebook.replay import read_notebook, replay_notebook

    try:
        read_notebook(args.notebook)  # bad input is one line and status 2, before any sandbox
    except ConfigError as exc:
        print(f"kernelbridge: {exc}", file=sys.stderr)
        return 2
    run = partial(replay_notebook, grant=tuple(args.grant))
    report = anyio.run(run, settings, args.notebook, args.output)
    print(report.text())
    if args.output:
        print(f"wrote {args.output}")
    return 1 if report.failed(strict=args.strict) else 0


def cmd_kernelspec(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.jupyter.kernelspec import install_kernelspec, visibility_note

    prefix = sys.prefix if args.sys_prefix else args.prefix
    path = install_kernelspec(user=prefix is None, prefix=prefix)
    print(f"installed the kernelbridge kernelspec in {path}")
    print("use it with: jupyter console --kernel kernelbridge (or pick it in JupyterLab)")
    print(visibility_note(path))
    return 0


def cmd_skills(args: argparse.Namespace, settings: Settings) -> int:
    """Saved tools live in ``<state_dir>/skills`` and, for each HTTP token, in
    ``<state_dir>/http/<namespace>/skills`` (shown as ``namespace/tool``); sandboxes use them only
    by importing them, so a person reviews them here (source as saved, byte for byte)."""
    from kernelbridge.errors import SkillError
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


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.demo import main as demo_main

    return demo_main()


COMMANDS = {
    "serve": cmd_serve,
    "image": cmd_image,
    "doctor": cmd_doctor,
    "sessions": cmd_sessions,
    "attach": cmd_attach,
    "export": cmd_export,
    "replay": cmd_replay,
    "kernelspec": cmd_kernelspec,
    "setup": cmd_setup,
    "skills": cmd_skills,
    "demo": cmd_demo,
}


STATEFUL = frozenset({"serve", "replay", "demo", "setup"})
"""Commands that write to the state directory."""


def _first_error(group: BaseExceptionGroup) -> KernelBridgeError | None:
    for exc in group.exceptions:
        if isinstance(exc, KernelBridgeError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (found := _first_error(exc)) is not None:
            return found
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        if args.command in STATEFUL:
            check_state_dir(settings)  # one line now, not a traceback from deep inside
        return COMMANDS[args.command](args, settings)
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


if __name__ == "__main__":
    sys.exit(main())
