"""``kernelbridge servers``: what a bridge would offer and from where, as a user runs it (the
command in a test HOME holding every client's file); never a command line, env, URL or header."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SECRETS = ("s3cret-env", "s3cret-header", "s3cret-url", "--token=s3cret-arg")


def write(path: Path, document: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else json.dumps(document))


def run_servers(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "KERNELBRIDGE_STATE_DIR": str(home / "state"),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "kernelbridge.cli", "servers", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )


def a_users_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    write(
        home / ".claude.json",
        {
            "projects": {"/p": {"history": [{"display": "x"}]}},
            "mcpServers": {
                "github": {
                    "command": "npx",
                    "args": ["-y", "server-github", "--token=s3cret-arg"],
                    "env": {"GITHUB_TOKEN": "s3cret-env"},
                },
                "python": {"command": "/home/me/.local/bin/kernelbridge", "args": ["serve"]},
            },
        },
    )
    write(
        home / ".cursor" / "mcp.json",
        {"mcpServers": {"docs": {"url": "https://u:s3cret-url@docs.example/mcp"}}},
    )
    write(
        home / ".config" / "Code" / "User" / "mcp.json",
        '{"servers": {"db": {"type": "http", "url": "https://db/mcp",'
        ' "headers": {"Authorization": "Bearer s3cret-header"}},},}  // jsonc',
    )
    write(home / ".config" / "Claude" / "claude_desktop_config.json", "{not json")
    write(home / "MCPs" / "mine.json", {"mcpServers": {"github": {"command": "my-github"}}})
    return home


def test_servers_lists_names_transports_and_sources(tmp_path: Path) -> None:
    home = a_users_home(tmp_path)
    proc = run_servers(home, KERNELBRIDGE_APPROVE_TOOLS="github.delete_*", KERNELBRIDGE_DENY_SERVERS="db")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "TRANSPORT", "SOURCE"]
    github = next(line for line in lines if line.startswith("github "))
    assert "stdio" in github and "~/MCPs/mine.json (~/MCPs)" in github
    assert "calls matching github.delete_* need approval" in github
    assert any(
        line.startswith("docs ") and "http" in line and "~/.cursor/mcp.json (Cursor)" in line
        for line in lines
    )
    db = next(line for line in lines if line.startswith("db "))
    assert "~/.config/Code/User/mcp.json (VS Code)" in db and "denied by KERNELBRIDGE_DENY_SERVERS" in db
    assert "replaced: github of ~/.claude.json (Claude Code (user)), by ~/MCPs/mine.json" in out
    assert "skipped:  python of ~/.claude.json (Claude Code (user)) launches kernelbridge itself" in out
    (problem,) = [line for line in lines if line.startswith("problem:")]
    assert problem.startswith("problem:  ~/.config/Claude/claude_desktop_config.json: not valid JSON")
    for secret in SECRETS:
        assert secret not in out + proc.stderr


def test_servers_json_and_project_scope(tmp_path: Path) -> None:
    home = a_users_home(tmp_path)
    project = tmp_path / "repo"
    write(project / ".mcp.json", {"mcpServers": {"proj": {"command": "p"}}})
    plain = json.loads(run_servers(home, "--json").stdout)
    assert "proj" not in {s["name"] for s in plain["servers"]} and plain["project"] is None
    asked = json.loads(run_servers(home, "--json", "--project", str(project)).stdout)
    proj = next(s for s in asked["servers"] if s["name"] == "proj")
    assert proj == {
        "name": "proj",
        "alias": "proj",
        "transport": "stdio",
        "source": str(project / ".mcp.json"),
        "origin": "Claude Code (project)",
        "allowed": True,
    }
    text = json.dumps(asked)
    for secret in SECRETS:
        assert secret not in text
    for key in ("command", "args", "env", "url", "headers"):
        assert all(key not in s for s in asked["servers"])


def test_no_servers_says_where_it_looked(tmp_path: Path) -> None:
    proc = run_servers(tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("no host MCP servers found; looked in ~/.claude.json,")
    assert "~/.cursor/mcp.json" in proc.stdout and "~/MCPs/*.json" in proc.stdout
