"""``%pip`` in the sandbox kernel: install through the host, list and show locally.

IPython extension (``--IPKernelApp.extensions``). At load it puts the session's packages directory on
``sys.path`` (``mcp._packages.activate``: installs survive a kernel restart), registers ``%pip``
(``install [-U] [-q] [-r FILE]... REQUIREMENT...``, ``list``, ``freeze``, ``show NAME...``) and
rewrites ``!pip``, ``!pip3`` and ``!python -m pip`` lines into ``%pip``. ``install`` sends the
requirements as typed (the host refuses what is not a plain requirement); ``-U``, ``-q`` and ``-r
FILE`` (read in the sandbox) are the magic's own, any other option is refused before the host is
asked. A failure is one line (``UsageError``), the cell's status ``error``, nothing installed, every
variable kept.
"""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from pathlib import Path
from typing import Any

MAX_REQUIREMENTS_FILE = 1024 * 1024
"""Bytes of a ``-r`` file read (a real requirements file has a few kilobytes)."""
USAGE = (
    "%pip install [-U] [-q] [-r FILE] REQUIREMENT... | %pip list | %pip freeze | %pip show NAME..."
    " (packages come through the host: the sandbox has no network)"
)
_SHELL_PIP = re.compile(
    r"^(?P<indent>\s*)!\s*(?:pip3?|python3?\s+-m\s+pip|\{sys\.executable\}\s+-m\s+pip)(?P<rest>(?:\s.*)?)$"
)


def _sandbox(module: str) -> Any:
    """A module of the sandbox's ``mcp`` package (on the kernel's PYTHONPATH; imported by name, as
    to the host's type checker ``mcp`` is the MCP SDK)."""
    return importlib.import_module(module)


def _usage_error(message: str) -> Exception:
    from IPython.core.error import UsageError

    return UsageError(message)


def parse_install(words: list[str]) -> tuple[list[str], list[str], bool, bool]:
    """``install``'s arguments -> (requirements, requirement files, upgrade, quiet). Raises
    UsageError for an option this magic does not take."""
    requirements: list[str] = []
    files: list[str] = []
    upgrade = quiet = False
    items = iter(words)
    for word in items:
        if word in ("-U", "--upgrade"):
            upgrade = True
        elif word in ("-q", "--quiet"):
            quiet = True
        elif word in ("-r", "--requirement"):
            path = next(items, None)
            if path is None:
                raise _usage_error(f"{word} needs a file name")
            files.append(path)
        elif word.startswith(("--requirement=", "-r")) and word not in ("-r",):
            files.append(word.split("=", 1)[1] if "=" in word else word[2:])
        elif word.startswith("-"):
            raise _usage_error(
                f"%pip install {word}: that option is not accepted here (packages come through the"
                " host's pip, which decides where from; -U, -q and -r FILE are understood)"
            )
        else:
            requirements.append(word)
    return requirements, files, upgrade, quiet


def read_requirements_file(path: str) -> list[str]:
    """The requirement lines of a requirements file in the sandbox. Raises UsageError for an
    unreadable file or a line with an option (``--index-url``, ``-e``, a nested ``-r``...)."""
    file = Path(path)
    try:
        with file.open("rb") as stream:
            data = stream.read(MAX_REQUIREMENTS_FILE + 1)
    except OSError as exc:
        raise _usage_error(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_REQUIREMENTS_FILE:
        raise _usage_error(f"{path} is over {MAX_REQUIREMENTS_FILE:,} bytes; not a requirements file")
    text = data.decode(errors="replace").replace("\\\n", " ")
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise _usage_error(
                f"{path}, line {number}: {line[:60]!r} is an option; only requirements are accepted"
                " (the host's pip decides where packages come from)"
            )
        lines.append(line)
    return lines


def pip(line: str) -> None:
    """The ``%pip`` line magic."""
    _packages, mcp_error = _sandbox("mcp._packages"), _sandbox("mcp").McpError
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise _usage_error(f"%pip {line[:60]}: {exc}") from None
    command, args = (words[0], words[1:]) if words else ("", [])
    if command == "install":
        requirements, files, upgrade, quiet = parse_install(args)
        for path in files:
            requirements += read_requirements_file(path)
        if not requirements:
            raise _usage_error("%pip install: name at least one package (or -r FILE)")
        try:
            report = _packages.install(requirements, upgrade=upgrade, out=None if quiet else sys.stdout)
        except mcp_error as exc:
            raise _usage_error(f"pip install: {exc.message}") from None
        except KeyboardInterrupt:
            raise _usage_error("pip install: interrupted; nothing was installed") from None
        if not quiet:
            for text in report.lines():
                print(text)
        elif report.notes:
            print("\n".join(report.notes))
    elif command in ("list", "freeze"):
        rows = _packages.installed()
        if command == "freeze":
            print("\n".join(f"{row['name']}=={row['version']}" for row in rows))
            return
        width = max([len(row["name"]) for row in rows] + [7])
        vwidth = max([len(row["version"]) for row in rows] + [7])
        print(f"{'Package':<{width}} {'Version':<{vwidth}} Location")
        print(f"{'-' * width} {'-' * vwidth} --------")
        for row in rows:
            print(f"{row['name']:<{width}} {row['version']:<{vwidth}} {row['location']}")
    elif command == "show":
        if not args:
            raise _usage_error("%pip show: name a package")
        missing = []
        for index, name in enumerate(args):
            fields = _packages.show(name)
            if fields is None:
                missing.append(name)
                continue
            if index:
                print("---")
            print("\n".join(f"{key}: {value}" for key, value in fields.items()))
        if missing:
            print(f"WARNING: Package(s) not found: {', '.join(missing)}", file=sys.stderr)
    elif command == "uninstall":
        raise _usage_error(
            "%pip uninstall is not available: the session's packages live in its sandbox; a new"
            " session (or close_session) starts without them"
        )
    else:
        raise _usage_error(f"%pip {command}: not available in the sandbox; {USAGE}")


def rewrite_shell_pip(lines: list[str]) -> list[str]:
    """An input transformer: ``!pip ...`` (and ``!pip3``, ``!python -m pip``) becomes ``%pip ...``."""
    out = []
    for line in lines:
        match = _SHELL_PIP.match(line.rstrip("\n"))
        if match is None:
            out.append(line)
            continue
        ending = "\n" if line.endswith("\n") else ""
        out.append(f"{match['indent']}get_ipython().run_line_magic('pip', {match['rest'].strip()!r}){ending}")
    return out


def load_ipython_extension(ipython: Any) -> None:
    """Called by IPython once per kernel start (IPKernelApp.extensions)."""
    _sandbox("mcp._packages").activate()
    ipython.register_magic_function(pip, "line", "pip")
    ipython.input_transformers_cleanup.append(rewrite_shell_pip)
