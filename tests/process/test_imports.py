"""What each entry point imports, in a fresh interpreter: only what it uses (issue 24).

The commands that read a few files (``--version``, ``servers``, ``sessions``) import none of the
heavy libraries; a kernelspec kernel's tunnel process imports no MCP SDK (it has no MCP); a bridge
is built with the MCP server SDK and nothing that its start (in the background, after
``initialize`` is answered) or a first call loads. Timings are bench/bench_start.py's: this pins
the imports, so that a module-level import cannot bring the seconds back unnoticed. Also: every
package whose names are imported on first use (``kernelbridge.lazy``) resolves each of them.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.to_process
import pytest

import kernelbridge
from kernelbridge.lazy import typing_imports
from kernelbridge.session.store import SessionStore

HEAVY: tuple[str, ...] = ("mcp", "mcp_types", "pydantic", "jupyter_client", "zmq", "nbformat", "jsonschema")
HEAVY += ("PIL", "httpx2", "httpcore2", "packaging", "starlette")
"""What no command that reads a few files imports (each is 0.05-1.5 s of a start here)."""
MCP_SDK = ("mcp", "mcp_types")
BRIDGE_LATER: tuple[str, ...] = ("jupyter_client", "zmq", "nbformat", "jsonschema", "PIL", "packaging")
BRIDGE_LATER += ("kernelbridge.hub.clients", "kernelbridge.session.registry", "kernelbridge.host.owner")
BRIDGE_LATER += ("kernelbridge.runtime.select", "kernelbridge.packages.service", "kernelbridge.image.build")
"""What a bridge loads after it answered ``initialize`` (the start's modules) or at first use: the
host MCP client pool, sessions, sandboxes and their tunnels, engines, ``%pip``, notebooks, images.
(The SDK's own client modules come with its server: ``mcp`` imports both.)"""
MARK = "@@modules@@"

COMMAND = f"""
import json, sys
from kernelbridge.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print({MARK!r} + json.dumps(sorted(sys.modules)))
"""
TUNNEL_PROCESS = f"""
import json, runpy, sys
sys.argv = ["tunnel_process", "--help"]
try:
    runpy.run_module("kernelbridge.jupyter.tunnel_process", run_name="__main__")
except SystemExit:
    pass
print({MARK!r} + json.dumps(sorted(sys.modules)))
"""
BRIDGE = f"""
import json, sys
from kernelbridge.lazy import skip_unused_imports
skip_unused_imports()
from kernelbridge.config import load_settings
from kernelbridge.server.app import build_server
build_server(load_settings())
print({MARK!r} + json.dumps(sorted(sys.modules)))
"""


def imported(code: str, *args: str, home: Path) -> set[str]:
    """The modules a fresh interpreter has after ``code`` (with ``args``), in a user's ``home``."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "KERNELBRIDGE_STATE_DIR": str(home / "state"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.rsplit(MARK, 1)[1]))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (packages or modules) are among ``modules``."""
    return [name for name in names if any(m == name or m.startswith(name + ".") for m in modules)]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user with a host MCP server in Claude Code's file and a live session on the state directory."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text(json.dumps({"mcpServers": {"time": {"command": "uvx"}}}))
    SessionStore(home / "state").begin("live", connection_file="/c/live.json", container="kb-live")
    return home


@pytest.mark.parametrize("command", [["--version"], ["servers"], ["sessions"], ["sessions", "--json"]])
def test_a_command_that_reads_a_few_files_imports_no_heavy_library(command: list[str], home: Path) -> None:
    modules = imported(COMMAND, *command, home=home)
    assert "kernelbridge.cli.main" in modules
    assert loaded(modules, HEAVY) == []


def test_the_commands_do_their_work_with_what_they_import(home: Path) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "kernelbridge.cli", "sessions"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(home), "KERNELBRIDGE_STATE_DIR": str(home / "state")},
        timeout=120,
        check=True,
    )
    assert "live" in listed.stdout and "kb-live" in listed.stdout


def test_a_kernelspec_kernels_tunnel_process_imports_no_mcp_sdk(home: Path) -> None:
    modules = imported(TUNNEL_PROCESS, home=home)
    assert "kernelbridge.host.owner" in modules  # the tunnel's owner: what it runs
    assert loaded(modules, (*MCP_SDK, "jupyter_client", "kernelbridge.hub.dispatch")) == []


def test_a_bridge_is_built_with_the_mcp_server_sdk_and_nothing_its_start_loads(home: Path) -> None:
    modules = imported(BRIDGE, home=home)
    assert "mcp.server.mcpserver" in modules
    assert loaded(modules, BRIDGE_LATER) == []


WORKER_PROBE = (
    "[__import__('nbformat').__name__, repr(__import__('sys').modules.get('rfc3987_syntax', 'absent'))]"
)
"""What a journal worker's nbformat brought along: ``None`` is "not importable" (skipped)."""


@pytest.mark.anyio
async def test_a_journal_worker_imports_nbformat_without_the_unused_grammar() -> None:
    # The worker that exports journals is an interpreter no command line started: it must skip
    # what every command skips (kernelbridge.lazy), or a bridge's first export builds the grammar.
    from kernelbridge.notebook.export import run_niced

    with anyio.fail_after(60):
        found = await anyio.to_process.run_sync(run_niced, eval, WORKER_PROBE)
    assert found == ["nbformat", "None"], found


def lazy_packages() -> list[str]:
    root = Path(kernelbridge.__file__).parent
    found = []
    for init in sorted(root.rglob("__init__.py")):
        if "lazy_exports(" in init.read_text(encoding="utf-8"):
            found.append(".".join(init.parent.relative_to(root.parent).parts))
    return found


def test_the_lazy_packages_are_found() -> None:
    assert {"kernelbridge.hub", "kernelbridge.session", "kernelbridge.host"} <= set(lazy_packages())


@pytest.mark.parametrize("package", lazy_packages())
def test_a_lazy_package_resolves_every_name_it_exports(package: str) -> None:
    module = importlib.import_module(package)
    source = Path(module.__file__ or "").read_text(encoding="utf-8")
    lazy = typing_imports(source)
    assert lazy, f"{package} imports nothing lazily"
    assert set(lazy) <= set(module.__all__), f"{package}: lazy names missing from __all__"
    for name, (origin, attribute) in lazy.items():
        assert getattr(module, name) is getattr(importlib.import_module(origin), attribute), name
    # A name that is also a submodule's would be replaced by the module when that is imported.
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert set(lazy) & submodules == set(), f"{package}: import these eagerly"
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")  # noqa: B009 - the lazy __getattr__'s own refusal
