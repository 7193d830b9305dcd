"""``kernelbridge sessions``, ``attach`` and ``export``: the live sessions of every bridge on this
state directory, a Jupyter console on one of them, and a session's journal as a notebook."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError, SessionError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    sessions = sub.add_parser(
        "sessions", help="list live and detached sessions (--all: every generation); `sessions close NAME`"
    )
    sessions.add_argument("--json", action="store_true", help="machine-readable output")
    sessions.add_argument("--all", action="store_true", help="every generation of every session, live or not")
    sessions.set_defaults(run=cmd_sessions)
    actions = sessions.add_subparsers(dest="action")
    close = actions.add_parser("close", help="end a session now (a detached one's sandbox too)")
    close.add_argument("name", help="the session (namespace/session for an HTTP token's)")
    close.set_defaults(run=cmd_close)

    attach = sub.add_parser("attach", help="open `jupyter console --existing` on a live session")
    attach.add_argument("session")
    attach.add_argument("--print", action="store_true", help="only print the connection file path")
    attach.set_defaults(run=cmd_attach)

    export = sub.add_parser("export", help="export a session's journal as a notebook")
    export.add_argument("session", help="NAME (its current generation) or NAME@N (generation N)")
    export.add_argument("-o", "--output", required=True, help="output .ipynb path")
    export.set_defaults(run=cmd_export)


def cmd_sessions(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.session.records import Standing
    from kernelbridge.session.store import list_session_records, warm_sandboxes

    if args.all:
        from kernelbridge.cli.history import show_generations

        return show_generations(settings, as_json=args.json)
    records = list_session_records(settings.state_dir)
    if args.json:
        print(json.dumps(records, indent=2, default=str))
        return 0
    if not records:
        print("no live sessions")
    else:
        print(f"{'SESSION':<20} {'STATE':<9} {'CONTAINER':<36} {'OWNER':>7}  CONNECTION FILE")
    for r in records:
        container, owner = r.get("container") or "-", r.get("owner_pid", "-")
        print(f"{r['name']:<20} {r['state']:<9} {container:<36} {owner:>7}  {r['connection_file'] or '-'}")
    warm = warm_sandboxes(settings.state_dir)
    if any(warm.values()):
        attached, detached = warm[Standing.ATTACHED], warm[Standing.DETACHED]
        print(f"warm pool: {attached} sandbox(es) attached, {detached} detached (no session yet)")
    return 0


def cmd_close(args: argparse.Namespace, settings: Settings) -> int:
    """End session NAME at once: its sandbox is removed (a bridge that holds it finds it gone and
    says so on its next call) and a detached one's generation ended."""
    import anyio

    from kernelbridge.runtime import open_runtime
    from kernelbridge.session.durability import end_record
    from kernelbridge.session.store import SessionStore

    namespace, _, session = args.name.rpartition("/")
    store = SessionStore.of_namespace(settings.state_dir, namespace)
    record = store.current(session) if session else None
    if record is None or record.ended is not None:
        raise SessionError(f"no live session named {args.name!r} (see `kernelbridge sessions`)")
    if not record.durable:
        raise SessionError(f"session {args.name!r} ends with its bridge: close it there (close_session)")

    async def close() -> None:
        async with open_runtime(settings) as runtime:
            held = store.claim(session)
            try:
                await end_record(runtime, store, record, settings.state_dir)
            finally:
                if held is not None:
                    held.release()

    anyio.run(close)
    print(f"closed session {args.name}")
    return 0


def find_session(settings: Settings, name: str) -> dict[str, Any]:
    from kernelbridge.session.store import list_session_records

    for record in list_session_records(settings.state_dir):
        if record["name"] == name:
            return record
    raise SessionError(f"no live session named {name!r} (see `kernelbridge sessions`)")


def cmd_attach(args: argparse.Namespace, settings: Settings) -> int:
    connection_file = str(find_session(settings, args.session)["connection_file"])
    if args.print:
        print(connection_file)
        return 0
    # Beside our own interpreter first: the venv's bin directory need not be on PATH.
    beside = Path(sys.executable).with_name("jupyter-console")
    console = str(beside) if beside.exists() else shutil.which("jupyter-console")
    if console is None:
        raise KernelBridgeError("jupyter console is not installed (pip install jupyter-console)")
    from kernelbridge.jupyter.client_env import os_username

    # The console's cells are journalled with its session's username: the person's, never
    # jupyter_client's placeholder ("username" when $USER is unset).
    argv = [console, "--existing", connection_file, f"--Session.username={os_username()}"]
    if not sys.stdin.isatty():  # scripted input: prompt_toolkit needs a terminal
        argv.append("--simple-prompt")
    os.execv(console, argv)


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.session.generations import export_session

    path = export_session(settings, args.session, args.output)
    print(f"wrote {path}")
    return 0
