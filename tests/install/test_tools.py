"""kernelbridge-mcp installed the ways its README says, by the real tools: ``pipx install``,
``uv tool install`` and ``uvx``, each taken from the package index into a fresh virtualenv and
pointed at the wheel built from this tree (nothing is published: the index does not have
``kernelbridge-mcp``, so ``uvx --find-links DIR kernelbridge-mcp`` finds the local wheel by the
very name a user types).

Each installation is then used as a user would: the commands it links, ``servers`` in a HOME with
an MCP client's file, ``setup`` (whose printed entry must name the stable shim, not the tool's
private virtualenv, or ``uvx`` itself), and a real MCP session through the linked
``kernelbridge-mcp`` script with no arguments (it serves by default).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bridge_harness import uses_state_dir
from install_harness import PIP_TIMEOUT, Dists, run
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from kernelbridge import DISTRIBUTION, __version__

pytestmark = [pytest.mark.slow, pytest.mark.install, pytest.mark.podman]

TOOLS = ("pipx", "uv")
"""Installed from the index with pip, as a user would get them."""


@dataclass(frozen=True)
class Tools:
    bin: Path
    """The fresh virtualenv's bin directory, holding pipx, uv and uvx."""
    python: Path
    uv_cache: Path
    """uv's cache (pipx installs with uv too), one for the module's tests as a user has one for
    all their installs: each test still resolves against the index and installs into fresh
    directories of its own, but downloads and unpacks each wheel once."""


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tools]:
    root = tmp_path_factory.mktemp("tools")
    venv = root / "venv"
    # The tools are what is used here, not this virtualenv's own pip: the checkout's pip installs
    # them into it (--python), which spares creating and running a second pip.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    run([*pip, "--quiet", "--disable-pip-version-check", *TOOLS], timeout=PIP_TIMEOUT)
    yield Tools(venv / "bin", venv / "bin" / "python", root / "uv-cache")
    # ~36,000 files: removed here, beside the other workers' tests, rather than by a later run's
    # pytest, which deletes the fourth-newest run's directory alone at its very end.
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def user_home(tmp_path: Path) -> Path:
    """A HOME with a Claude Code user config holding one server and kernelbridge's own entry."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "uvx", "args": ["mcp-server-time"]},
                    "python": {"command": "uvx", "args": [DISTRIBUTION]},
                }
            }
        )
    )
    return home


def environ(tools: Tools, home: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """A user's environment: the tools first on PATH, their homes under ``tmp`` (uv's cache is the
    module's, :attr:`Tools.uv_cache`), no checkout."""
    env = {key: value for key, value in os.environ.items() if _passed_on(key)}
    env.update(
        PATH=f"{tmp / 'bin'}:{tools.bin}:{env.get('PATH', '/usr/bin:/bin')}",
        HOME=str(home),
        KERNELBRIDGE_STATE_DIR=str(uses_state_dir(tmp / "state")),
        PIPX_HOME=str(tmp / "pipx"),
        PIPX_BIN_DIR=str(tmp / "bin"),
        PIPX_MAN_DIR=str(tmp / "man"),
        UV_TOOL_DIR=str(tmp / "uv-tools"),
        UV_TOOL_BIN_DIR=str(tmp / "bin"),
        UV_CACHE_DIR=str(tools.uv_cache),
        UV_PYTHON=str(tools.python),
        UV_PYTHON_DOWNLOADS="never",
        **extra,
    )
    return env


def _passed_on(key: str) -> bool:
    """What a user's shell has that the tools need here: the machine's certificates and proxies
    (this machine reaches the index through a TLS proxy of its own), pip's and uv's settings."""
    upper = key.upper()
    return (
        key
        in (
            "PATH",
            "LANG",
            "KERNELBRIDGE_LABELS",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "REQUESTS_CA_BUNDLE",
        )
        or upper.endswith("_PROXY")
        or key.startswith(("PIP_", "UV_"))
    )


def sh(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(argv, timeout=PIP_TIMEOUT, env=env, cwd=cwd)


def setup_entry(output: str) -> dict[str, object]:
    entry = json.loads(output[output.index("{") : output.rindex("}") + 1])
    python: dict[str, object] = entry["mcpServers"]["python"]
    return python


async def one_session(command: str, args: list[str], env: dict[str, str], cwd: Path) -> str:
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(cwd))
    async with Client(params, read_timeout_seconds=300) as client:
        result = await client.call_tool("run_python", {"code": "import sys\n6 * 7"})
    assert not result.is_error, result.content
    return str(result.structured_content["result"])


@pytest.fixture(autouse=True)
def installed_tools_removed(tmp_path: Path) -> Iterator[None]:
    """What pipx or uv installed for a test (~12,000 files) goes after it, as the tools' own
    virtualenv does after the module."""
    yield
    for name in ("pipx", "uv-tools"):
        shutil.rmtree(tmp_path / name, ignore_errors=True)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "work"
    path.mkdir()
    yield path


@pytest.mark.anyio
async def test_pipx_install(
    tools: Tools, dists: Dists, user_home: Path, tmp_path: Path, workdir: Path, sandbox_image: str
) -> None:
    env = environ(tools, user_home, tmp_path)
    sh([str(tools.bin / "pipx"), "install", str(dists.wheel)], env, workdir)
    shims = tmp_path / "bin"
    for script in ("kernelbridge", "kernelbridge-mcp"):
        assert (shims / script).is_symlink(), f"pipx linked no {script}"
        assert (shims / script).resolve().is_relative_to(tmp_path / "pipx" / "venvs" / DISTRIBUTION)
    version = sh([str(shims / "kernelbridge"), "--version"], env, workdir)
    assert version.stdout.strip() == f"kernelbridge {__version__}"
    servers = sh([str(shims / "kernelbridge"), "servers"], env, workdir)
    assert "time" in servers.stdout and "~/.claude.json (Claude Code (user))" in servers.stdout
    assert "python of ~/.claude.json (Claude Code (user)) launches kernelbridge itself" in servers.stdout
    setup = sh([str(shims / "kernelbridge"), "setup"], env, workdir)
    entry = setup_entry(setup.stdout)
    # The shim pipx linked, never pipx's private virtualenv behind it.
    assert entry["command"] == str(shims / "kernelbridge") and entry["args"] == ["serve"]
    assert await one_session(str(shims / "kernelbridge-mcp"), [], env, workdir) == "42"


@pytest.mark.anyio
async def test_uv_tool_install(
    tools: Tools, dists: Dists, user_home: Path, tmp_path: Path, workdir: Path, sandbox_image: str
) -> None:
    env = environ(tools, user_home, tmp_path)
    sh([str(tools.bin / "uv"), "tool", "install", str(dists.wheel)], env, workdir)
    shims = tmp_path / "bin"
    for script in ("kernelbridge", "kernelbridge-mcp"):
        assert (shims / script).resolve().is_relative_to(tmp_path / "uv-tools" / DISTRIBUTION)
    listed = sh([str(tools.bin / "uv"), "tool", "list"], env, workdir)
    assert f"{DISTRIBUTION} v{__version__}" in listed.stdout
    setup = sh([str(shims / "kernelbridge"), "setup"], env, workdir)
    assert setup_entry(setup.stdout)["command"] == str(shims / "kernelbridge")
    assert await one_session(str(shims / "kernelbridge"), ["serve"], env, workdir) == "42"


@pytest.mark.anyio
async def test_uvx(
    tools: Tools, dists: Dists, user_home: Path, tmp_path: Path, workdir: Path, sandbox_image: str
) -> None:
    env = environ(tools, user_home, tmp_path)
    uvx = str(tools.bin / "uvx")
    find = ["--find-links", str(dists.wheel.parent)]
    # The name a user types, resolved to the local wheel (the index has no kernelbridge-mcp).
    version = sh([uvx, *find, DISTRIBUTION, "--version"], env, workdir)
    assert version.stdout.strip() == f"kernelbridge {__version__}"
    servers = sh([uvx, "--from", str(dists.wheel), "kernelbridge", "servers", "--json"], env, workdir)
    assert [s["name"] for s in json.loads(servers.stdout)["servers"]] == ["time"]
    # Run from uvx's throw-away environment, setup points the client at uvx, not into the cache.
    setup = sh([uvx, *find, DISTRIBUTION, "setup"], env, workdir)
    entry = setup_entry(setup.stdout)
    assert entry["command"] == "uvx" and entry["args"] == [DISTRIBUTION, "serve"]
    # `uvx kernelbridge-mcp` as an MCP client's whole entry: it serves.
    assert await one_session(uvx, [*find, DISTRIBUTION], env, workdir) == "42"
