"""Host MCP server config: discovery, precedence, bad files and entries, self-launch, remote entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelbridge.config import load_settings
from kernelbridge.hub import HttpServer, StdioServer, config_files, launches_kernelbridge, load_catalog


def write(path: Path, servers: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def env_for(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), "KERNELBRIDGE_STATE_DIR": str(home / "state"), **extra}


def test_discovery_order_and_later_wins(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home / "MCPs" / "b.json", {"x": {"command": "from-mcps-b"}, "only_b": {"command": "b"}})
    write(home / "MCPs" / "a.json", {"x": {"command": "from-mcps-a"}, "only_a": {"command": "a"}})
    write(home / ".config" / "mcp" / "servers" / "s.json", {"x": {"command": "from-config"}})
    extra_dir = tmp_path / "extra"
    write(extra_dir / "1.json", {"y": {"command": "from-dir"}})
    flag = write(tmp_path / "flag.json", {"x": {"command": "from-flag"}, "y": {"command": "from-flag"}})
    env = env_for(home, KERNELBRIDGE_SERVERS_CONFIG=f"{extra_dir}:{flag}")
    settings = load_settings(env)

    files = config_files(settings, env)
    assert files == [
        home / "MCPs" / "a.json",
        home / "MCPs" / "b.json",
        home / ".config" / "mcp" / "servers" / "s.json",
        extra_dir / "1.json",
        flag,
    ]
    catalog = load_catalog(settings, env)
    assert catalog.problems == ()
    commands = {name: s.command for name, s in catalog.servers.items() if isinstance(s, StdioServer)}
    assert commands == {"x": "from-flag", "only_a": "a", "only_b": "b", "y": "from-flag"}
    # A replaced name keeps its first position: aliases stay stable when a later file overrides.
    assert list(catalog.servers) == ["x", "only_a", "only_b", "y"]


def test_missing_default_dirs_are_fine_but_a_missing_explicit_file_is_a_problem(tmp_path: Path) -> None:
    env = env_for(tmp_path, KERNELBRIDGE_SERVERS_CONFIG=str(tmp_path / "nope.json"))
    catalog = load_catalog(load_settings(env), env)
    assert catalog.servers == {}
    assert catalog.problems == ("~/nope.json: no such file; file skipped",)


def test_malformed_file_beside_a_good_one(tmp_path: Path) -> None:
    mcps = tmp_path / "MCPs"
    write(mcps / "good.json", {"ok": {"command": "ok"}})
    (mcps / "bad.json").write_text('{"mcpServers": {"broken": ')
    (mcps / "list.json").write_text("[1, 2]")
    (mcps / "other.json").write_text('{"servers": {}}')
    env = env_for(tmp_path)
    catalog = load_catalog(load_settings(env), env)
    assert list(catalog.servers) == ["ok"]
    assert len(catalog.problems) == 3
    bad, listed, other = catalog.problems
    assert bad.startswith("~/MCPs/bad.json: not valid JSON (line 1") and bad.endswith("; file skipped")
    assert listed == '~/MCPs/list.json: expected a JSON object with "mcpServers", found a list; file skipped'
    assert other == '~/MCPs/other.json: no "mcpServers" object; file skipped'
    assert all("\n" not in p for p in catalog.problems)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("nope", "the entry must be an object, not a string"),
        ({}, "needs a 'command' (stdio) or a 'url' (streamable HTTP)"),
        ({"command": 3}, "'command' must be a string, not a number"),
        ({"command": "x", "args": "a b"}, "'args' must be a list of strings"),
        ({"command": "x", "args": ["a", 1]}, "'args' must be a list of strings"),
        ({"command": "x", "env": {"K": 1}}, "'env' must be an object whose values are strings"),
        ({"command": "x", "env": {"A=B": "v"}}, "'env' has an invalid variable name"),
        ({"command": "x", "cwd": 5}, "'cwd' must be a string"),
        ({"command": "x", "url": "http://h"}, "has both 'command' and 'url'"),
        ({"url": "ftp://h/x"}, "'url' must be an http:// or https:// URL"),
        ({"url": "http://h/x", "headers": ["a"]}, "'headers' must be an object whose values are strings"),
        ({"type": "sse", "url": "http://h/sse"}, "'type': 'sse' (the deprecated HTTP+SSE transport) is not"),
        ({"type": "websocket", "url": "ws://h"}, "unknown 'type' 'websocket'"),
    ],
)
def test_malformed_entry_is_skipped_with_one_line(tmp_path: Path, entry: object, reason: str) -> None:
    write(tmp_path / "MCPs" / "c.json", {"bad": entry, "good": {"command": "ok"}})
    env = env_for(tmp_path)
    catalog = load_catalog(load_settings(env), env)
    assert list(catalog.servers) == ["good"]
    (problem,) = catalog.problems
    assert problem.startswith("~/MCPs/c.json: server 'bad': " + reason), problem
    assert problem.endswith("; skipped")


def test_secret_values_never_appear_in_problems_or_repr(tmp_path: Path) -> None:
    write(
        tmp_path / "MCPs" / "c.json",
        {
            "bad": {"command": "x", "env": {"TOKEN": "s3cret-env", "N": 5}},
            "ok": {"command": "x", "env": {"TOKEN": "s3cret-env"}},
            "remote": {
                "url": "https://user:pw@h/mcp?key=s3cret-url",
                "headers": {"Authorization": "Bearer s3cret-h"},
            },
        },
    )
    env = env_for(tmp_path)
    catalog = load_catalog(load_settings(env), env)
    text = repr(catalog) + " ".join(catalog.problems)
    for secret in ("s3cret-env", "s3cret-url", "s3cret-h", "pw@"):
        assert secret not in text
    assert catalog.servers["ok"].env == {"TOKEN": "s3cret-env"}  # type: ignore[union-attr]


def test_remote_entries_and_type_keys(tmp_path: Path) -> None:
    write(
        tmp_path / "MCPs" / "r.json",
        {
            "plain": {"url": "https://example.test/mcp", "description": "remote"},
            "typed": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": "k"}},
            "dashed": {"type": "streamable-http", "url": "http://h/mcp"},
            "camel": {"transport": "streamableHttp", "url": "http://h/mcp"},
            "local": {"type": "stdio", "command": "srv", "args": ["--x"], "cwd": "~/work"},
            "off": {"command": "srv", "disabled": True},
            "extra": {"command": "srv", "autoApprove": ["a"], "timeout": 60},
        },
    )
    env = env_for(tmp_path)
    catalog = load_catalog(load_settings(env), env)
    assert catalog.problems == ()
    assert list(catalog.servers) == ["plain", "typed", "dashed", "camel", "local", "extra"]
    typed = catalog.servers["typed"]
    assert isinstance(typed, HttpServer) and typed.headers == {"X-Key": "k"} and typed.transport == "http"
    assert catalog.servers["plain"].description == "remote"
    local = catalog.servers["local"]
    assert isinstance(local, StdioServer) and local.args == ("--x",) and local.transport == "stdio"
    assert local.cwd == Path("~/work").expanduser()


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("kernelbridge", ["serve"]),
        ("/home/u/.venv/bin/kernelbridge", ["serve", "--http"]),
        ("uvx", ["kernelbridge", "serve"]),
        ("uvx", ["kernelbridge==0.1", "serve"]),
        ("pipx", ["run", "kernelbridge", "serve"]),
        ("python3", ["-m", "kernelbridge", "serve"]),
        ("/usr/bin/python3.11", ["-m", "kernelbridge.cli", "serve"]),
        ("python", ["-mkernelbridge"]),
        ("sh", ["-c", "exec /opt/kb/bin/kernelbridge serve"]),
        ("bash", ["-lc", "python -m kernelbridge serve"]),
        # The distribution's own script serves when given no other command.
        ("uvx", ["kernelbridge-mcp"]),
        ("uvx", ["kernelbridge-mcp@0.1.0", "serve", "--http"]),
        ("uvx", ["--from", "kernelbridge-mcp", "kernelbridge", "serve"]),
        ("/home/u/.local/bin/kernelbridge-mcp", []),
        ("kernelbridge-mcp", ["--servers-config", "x.json"]),
        ("pipx", ["run", "kernelbridge-mcp"]),
        ("uv", ["tool", "run", "kernelbridge-mcp==0.1.0"]),
        ("sh", ["-c", "exec uvx kernelbridge-mcp"]),
    ],
)
def test_self_launching_entries(command: str, args: list[str]) -> None:
    assert launches_kernelbridge(command, args)


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("python", ["-m", "mcp_server_time"]),
        ("kernelbridge-helper", ["serve"]),
        ("npx", ["-y", "@modelcontextprotocol/server-everything"]),
        ("kernelbridge", ["doctor"]),
        ("sh", ["-c", "echo kernelbridge"]),
        ("uvx", ["--from", "kernelbridge-mcp", "kernelbridge", "doctor"]),
        ("uvx", ["kernelbridge-mcp", "servers"]),
        ("kernelbridge-mcp-helper", []),
        ("sh", ["-c", "uvx kernelbridge-mcp doctor"]),
    ],
)
def test_other_entries_are_not_self(command: str, args: list[str]) -> None:
    assert not launches_kernelbridge(command, args)


def test_self_entry_is_skipped_with_a_note(tmp_path: Path) -> None:
    write(
        tmp_path / "MCPs" / "c.json",
        {"me": {"command": "kernelbridge", "args": ["serve"]}, "ok": {"command": "x"}},
    )
    env = env_for(tmp_path)
    catalog = load_catalog(load_settings(env), env)
    assert list(catalog.servers) == ["ok"]
    assert catalog.problems == (
        "~/MCPs/c.json: server 'me': it would launch kernelbridge itself (a bridge calling itself); skipped",
    )


def test_bad_server_names(tmp_path: Path) -> None:
    write(
        tmp_path / "MCPs" / "c.json",
        {"": {"command": "x"}, "a\nb": {"command": "x"}, "x" * 129: {"command": "x"}},
    )
    env = env_for(tmp_path)
    catalog = load_catalog(load_settings(env), env)
    assert catalog.servers == {}
    # One line for the file, naming each entry skipped (a name with a newline shown escaped).
    (problem,) = catalog.problems
    assert problem.startswith("~/MCPs/c.json: 3 entries skipped: server '': a name must be 1 to 128")
    assert problem.count("a name must be 1 to 128 printable characters") == 3
    assert "\n" not in problem


def test_oversized_file(tmp_path: Path) -> None:
    path = tmp_path / "MCPs" / "big.json"
    path.parent.mkdir()
    path.write_text(" " * (1024 * 1024 + 1))
    env = env_for(tmp_path)
    assert load_catalog(load_settings(env), env).problems == (
        "~/MCPs/big.json: larger than 1024 KiB; file skipped",
    )
