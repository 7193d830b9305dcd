"""The servers users already configured for their MCP clients, found in a test HOME: each client's
own file and format (Claude Code's ``~/.claude.json`` with project histories, Claude Desktop,
Cursor, VS Code's JSONC ``servers``), precedence, project scope only when asked, variables as each
client expands them, and bad files reported in one line each while the rest is used."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from kernelbridge.config import load_settings
from kernelbridge.errors import ConfigError
from kernelbridge.hub import HttpServer, StdioServer, config_files, load_catalog
from kernelbridge.hub.jsonread import JsonReadError, pick, strip_jsonc


def env_for(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), "KERNELBRIDGE_STATE_DIR": str(home / "state"), **extra}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def catalog_of(home: Path, **extra: str):  # type: ignore[no-untyped-def]
    env = env_for(home, **extra)
    return load_catalog(load_settings(env), env)


VSCODE_JSONC = """\
// VS Code's user MCP file: comments, trailing commas, "servers"
{
  "inputs": [{"type": "promptString", "id": "key", "password": true}],
  "servers": {
    /* a stdio server */
    "vs-time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time",],},
    "vs-remote": {"type": "http", "url": "https://vs.example/mcp", "headers": {"X-Url": "//not-a-comment"}},
    "vs-secret": {"command": "srv", "env": {"KEY": "${input:key}"}},
    "vs-home": {"command": "${userHome}/bin/srv", "env": {"P": "${env:KB_TEST_VALUE}"}},
  },
}
"""


def client_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    write(
        home / ".claude.json",
        json.dumps(
            {
                "numStartups": 3,
                "mcpServers": {
                    "cc-time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
                    "cc-remote": {
                        "type": "http",
                        "url": "https://cc.example/mcp",
                        "headers": {"Authorization": "Bearer s3cret"},
                    },
                    "python": {"command": "kernelbridge", "args": ["serve"]},
                    "shared": {"command": "from-claude-code"},
                },
                "projects": {"/some/project": {"mcpServers": {"local-only": {"command": "x"}}}},
            }
        ),
    )
    write(
        home / ".config" / "Claude" / "claude_desktop_config.json",
        json.dumps(
            {
                "globalShortcut": "Ctrl+Space",
                "mcpServers": {
                    "desk": {"command": "npx", "args": ["-y", "server-x"]},
                    "shared": {"command": "from-desktop"},
                },
            }
        ),
    )
    write(
        home / ".cursor" / "mcp.json",
        json.dumps(
            {
                "mcpServers": {
                    "cur": {"url": "https://cursor.example/mcp"},
                    "shared": {"command": "from-cursor"},
                },
            }
        ),
    )
    write(home / ".config" / "Code" / "User" / "mcp.json", VSCODE_JSONC)
    return home


def test_every_clients_file_is_found_with_its_source(tmp_path: Path) -> None:
    home = client_home(tmp_path)
    catalog = catalog_of(home, KB_TEST_VALUE="v1")
    assert set(catalog.servers) == {
        "cc-time",
        "cc-remote",
        "shared",
        "desk",
        "cur",
        "vs-time",
        "vs-remote",
        "vs-home",
    }
    origins = {name: server.origin for name, server in catalog.servers.items()}
    assert origins["cc-time"] == "Claude Code (user)"
    assert origins["desk"] == "Claude Desktop"
    assert origins["cur"] == "Cursor"
    assert origins["vs-time"] == "VS Code"
    # Precedence: Claude Code, Claude Desktop, Cursor, VS Code (later wins), position kept.
    shared = catalog.servers["shared"]
    assert isinstance(shared, StdioServer) and shared.command == "from-cursor"
    assert list(catalog.servers).index("shared") < list(catalog.servers).index("desk")
    assert [(s.origin, s.name) for s in catalog.shadowed] == [
        ("Claude Code (user)", "shared"),
        ("Claude Desktop", "shared"),
    ]
    # Transports, JSONC (a "//" inside a string is not a comment), variables.
    assert isinstance(catalog.servers["cur"], HttpServer)
    remote = catalog.servers["vs-remote"]
    assert isinstance(remote, HttpServer) and remote.headers == {"X-Url": "//not-a-comment"}
    vs_time = catalog.servers["vs-time"]
    assert isinstance(vs_time, StdioServer) and vs_time.args == ("mcp-server-time",)
    vs_home = catalog.servers["vs-home"]
    assert isinstance(vs_home, StdioServer)
    assert vs_home.command == f"{home}/bin/srv" and vs_home.env == {"P": "v1"}
    # kernelbridge's own entry in a client's file is the normal case: skipped, not a problem.
    assert catalog.itself == (("python", home / ".claude.json", "Claude Code (user)"),)
    # One line for VS Code's file: the ${input:...} entry, with what to do.
    (problem,) = catalog.problems
    assert problem.startswith("~/.config/Code/User/mcp.json: server 'vs-secret': uses ${input:key}")
    assert "~/MCPs" in problem and "\n" not in problem
    # A project's local scope is not read unless asked.
    assert "local-only" not in catalog.servers


def test_kernelbridge_files_are_stronger_than_every_client(tmp_path: Path) -> None:
    home = client_home(tmp_path)
    write(home / "MCPs" / "a.json", json.dumps({"mcpServers": {"shared": {"command": "from-mcps"}}}))
    flag = write(tmp_path / "flag.json", json.dumps({"mcpServers": {"cc-time": {"command": "from-flag"}}}))
    catalog = catalog_of(home, KERNELBRIDGE_SERVERS_CONFIG=str(flag))
    assert catalog.servers["shared"].command == "from-mcps"  # type: ignore[union-attr]
    assert catalog.servers["cc-time"].command == "from-flag"  # type: ignore[union-attr]
    env = env_for(home, KERNELBRIDGE_SERVERS_CONFIG=str(flag))
    files = config_files(load_settings(env), env)
    assert files[0] == home / ".claude.json" and files[-1] == flag


def test_client_files_can_be_switched_off(tmp_path: Path) -> None:
    home = client_home(tmp_path)
    assert catalog_of(home, KERNELBRIDGE_CLIENT_CONFIGS="none").servers == {}
    only = catalog_of(home, KERNELBRIDGE_CLIENT_CONFIGS="cursor,claude-desktop")
    assert set(only.servers) == {"desk", "cur", "shared"}
    with pytest.raises(ConfigError, match="KERNELBRIDGE_CLIENT_CONFIGS: 'zed' is not one of"):
        load_settings(env_for(home, KERNELBRIDGE_CLIENT_CONFIGS="zed"))


def test_project_scope_only_when_asked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project = tmp_path / "repo"
    write(
        project / ".mcp.json",
        json.dumps(
            {
                "mcpServers": {
                    "proj": {"command": "${TOOL_DIR:-/opt/tools}/srv", "args": ["${PROJECT_ARG}"]},
                    "needs-var": {"command": "srv", "env": {"T": "${UNSET_TOKEN}"}},
                    "both": {"command": "from-mcp-json"},
                }
            }
        ),
    )
    write(project / ".cursor" / "mcp.json", json.dumps({"mcpServers": {"cur-proj": {"command": "c"}}}))
    write(
        project / ".vscode" / "mcp.json", '{"servers": {"vs-proj": {"command": "${workspaceFolder}/run"},}}'
    )
    write(
        home / ".claude.json",
        json.dumps(
            {
                "mcpServers": {"user": {"command": "u"}},
                "projects": {
                    str(project): {
                        "mcpServers": {"both": {"command": "from-local-scope"}},
                        "history": ["x"] * 50,
                    }
                },
            }
        ),
    )
    plain = catalog_of(home, PROJECT_ARG="a")
    assert set(plain.servers) == {"user"}
    asked = catalog_of(home, PROJECT_ARG="a", KERNELBRIDGE_PROJECT=str(project))
    assert set(asked.servers) == {"user", "proj", "both", "cur-proj", "vs-proj"}
    proj = asked.servers["proj"]
    assert isinstance(proj, StdioServer) and proj.command == "/opt/tools/srv" and proj.args == ("a",)
    assert asked.servers["vs-proj"].command == f"{project}/run"  # type: ignore[union-attr]
    # Claude Code's local scope wins over its project scope, as in Claude Code.
    both = asked.servers["both"]
    assert isinstance(both, StdioServer) and both.command == "from-local-scope"
    assert both.origin == "Claude Code (local)"
    (problem,) = asked.problems
    assert problem == (
        f"{project}/.mcp.json: server 'needs-var': uses ${{UNSET_TOKEN}}, which is not set in kernelbridge's"
        " environment; skipped"
    )


@pytest.mark.parametrize(
    ("where", "text", "reason"),
    [
        (".cursor/mcp.json", '{"mcpServers": {"a": ', "not valid JSON (line 1"),
        (".cursor/mcp.json", '// a comment\n{"mcpServers": {}}', "not valid JSON (line 1, column 1"),
        (
            ".config/Claude/claude_desktop_config.json",
            "[]",
            'expected a JSON object with "mcpServers", found a list',
        ),
        (".config/Code/User/mcp.json", '{"servers": [1]}', 'no "servers" object'),
        (
            ".claude.json",
            '{"mcpServers": {"a": {"command": "x"}',
            "not valid JSON (line 1: the document ends",
        ),
        (".claude.json", "", "not valid JSON (the file is empty)"),
        (".claude.json", '{"mcpServers": 3}', 'no "mcpServers" object'),
    ],
)
def test_a_broken_client_file_is_one_line_and_the_rest_is_used(
    tmp_path: Path, where: str, text: str, reason: str
) -> None:
    home = tmp_path / "home"
    write(home / where, text)
    write(home / "MCPs" / "ok.json", json.dumps({"mcpServers": {"ok": {"command": "ok"}}}))
    catalog = catalog_of(home)
    assert list(catalog.servers) == ["ok"]
    (problem,) = catalog.problems
    assert problem.startswith(f"~/{where}: {reason}"), problem
    assert problem.endswith("; file skipped") and "\n" not in problem


def test_unknown_entry_types_are_named_in_the_files_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(
        home / ".claude.json",
        json.dumps(
            {
                "mcpServers": {
                    "old": {"type": "sse", "url": "https://h/sse"},
                    "ws": {"type": "websocket", "url": "ws://h"},
                    "odd": {"type": 7},
                    "fine": {"command": "srv"},
                    "envfile": {"command": "srv", "envFile": "${userHome}/.env"},
                }
            }
        ),
    )
    catalog = catalog_of(home)
    assert list(catalog.servers) == ["fine"]
    (problem,) = catalog.problems
    assert problem.startswith("~/.claude.json: 4 entries skipped: server 'old': 'type': 'sse'")
    assert "server 'ws': unknown 'type' 'websocket'" in problem
    assert "server 'odd': 'type' must be a string" in problem
    assert "server 'envfile': 'envFile' is not supported" in problem


def test_secrets_stay_out_of_problems_and_reprs(tmp_path: Path) -> None:
    home = client_home(tmp_path)
    write(
        home / ".cursor" / "mcp.json",
        json.dumps(
            {
                "mcpServers": {
                    "bad": {"command": "x", "env": {"TOKEN": "s3cret-env", "N": 1}},
                    "bad-url": {"url": "ftp://user:s3cret-pw@h/x"},
                }
            }
        ),
    )
    catalog = catalog_of(home)
    text = repr(catalog) + " ".join(catalog.problems)
    for secret in ("s3cret", "Bearer"):
        assert secret not in text


def big_claude_json(path: Path, mib: int) -> Path:
    """A ~/.claude.json as it grows: hundreds of projects with long histories around the servers."""
    history = [{"display": "x" * 900 + ' "quoted" {braces} [brackets] \\ ', "pastedContents": {}}] * 20
    projects = {
        f"/home/me/p{i}": {"history": history, "allowedTools": [], "mcpServers": {}} for i in range(400)
    }
    document = {"projects": projects, "mcpServers": {"late": {"command": "found-after-the-histories"}}}
    text = json.dumps(document)
    repeat = max(1, (mib * 1024 * 1024) // len(text))
    projects_text = json.dumps(projects)[1:-1]
    body = ",".join(projects_text.replace('"/home/me/p', f'"/home/me/r{n}-p') for n in range(repeat))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '{"projects": {' + body + '}, "mcpServers": {"late": {"command": "found-after-the-histories"}}}'
    )
    return path


def test_a_claude_json_of_many_mib_is_walked_without_a_copy_on_the_heap(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = big_claude_json(home / ".claude.json", 24)
    assert path.stat().st_size > 20 * 1024 * 1024
    tracemalloc.start()
    try:
        catalog = catalog_of(home)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(catalog.servers) == ["late"] and catalog.problems == ()
    # Mapped and walked, not parsed: no copy of the file on the heap (json.loads of it builds
    # about three times its size in objects).
    assert peak < 2 * 1024 * 1024, f"peak heap {peak:,} bytes"


def test_pick_reads_only_the_wanted_paths(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.json",
        json.dumps(
            {
                "a": [1, {"b": "}]"}, "\\"],
                "x": {"y": {"z": 1}, "mcpServers": {"s": {}}},
                "mcpServers": {"t": 1},
                "n": -1.5e3,
            }
        ),
    )
    found = pick(path, [("mcpServers",), ("x", "mcpServers"), ("missing", "mcpServers")], 1 << 20)
    assert found == {("mcpServers",): {"t": 1}, ("x", "mcpServers"): {"s": {}}}
    write(tmp_path / "deep.json", '{"a": ' + "[" * 100 + "]" * 100 + "}")
    with pytest.raises(JsonReadError, match="nested deeper than 64 levels"):
        pick(tmp_path / "deep.json", [("mcpServers",)], 1 << 20)
    write(tmp_path / "big.json", '{"mcpServers": {"a": "' + "x" * (2 << 20) + '"}}')
    with pytest.raises(JsonReadError, match="mcpServers is larger than 1024 KiB"):
        pick(tmp_path / "big.json", [("mcpServers",)], 16 << 20)
    with pytest.raises(JsonReadError, match="larger than 1024 KiB"):
        pick(tmp_path / "big.json", [("mcpServers",)], 1 << 20)


def test_jsonc_keeps_positions_and_strings() -> None:
    text = '{\n  // c\n  "a": "http://x/*y*/", /* z\n */ "b": [1, 2,],\n}'
    stripped = strip_jsonc(text)
    assert len(stripped) == len(text) and stripped.count("\n") == text.count("\n")
    assert json.loads(stripped) == {"a": "http://x/*y*/", "b": [1, 2]}
