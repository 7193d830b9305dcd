"""What people and models are told about the host MCP config: the capabilities manual and the
doctor's ``hub`` line (both from config files only; no server is started)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from kernelbridge.cli.doctor import Doctor
from kernelbridge.config import load_settings
from kernelbridge.hub import Hub
from kernelbridge.server.manual import MAX_LISTED_SERVERS, ServerLine, render_manual

SECRET = "tok-" + "9d8e7f"


def write_home(home: Path, servers: dict[str, object], broken: bool = False) -> dict[str, str]:
    (home / "MCPs").mkdir(parents=True)
    (home / "MCPs" / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    if broken:
        (home / "MCPs" / "broken.json").write_text("{")
    return {"HOME": str(home), "KERNELBRIDGE_STATE_DIR": str(home / "state")}


SERVERS = {
    "time": {"command": "/opt/secret-path/python", "args": ["-m", "t"], "env": {"KEY": SECRET}},
    "Remote Docs": {
        "url": f"https://user:{SECRET}@docs.example/mcp",
        "headers": {"Authorization": f"Bearer {SECRET}"},
        "description": "Search the team's docs",
    },
    "self": {"command": "kernelbridge", "args": ["serve"]},
}


def test_the_manual_says_how_to_call_host_servers_and_lists_them() -> None:
    manual = render_manual(
        [ServerLine("time", "time", "Current time"), ServerLine("Remote Docs", "remote_docs", "")],
        ["~/MCPs/broken.json: not valid JSON; file skipped"],
    )
    assert "not available yet" not in manual
    assert 'servers=["name"]' in manual and "await mcp_<alias>.<tool>(" in manual
    assert "search_tool_docs_sync" in manual and "save_tool" in manual
    assert "- `time` as `mcp_time`: Current time" in manual
    assert "- `Remote Docs` as `mcp_remote_docs`\n" in manual
    assert "- ~/MCPs/broken.json: not valid JSON; file skipped" in manual
    assert "No host MCP servers are configured" in render_manual()


def test_a_long_list_is_cut_short() -> None:
    servers = [ServerLine(f"s{i}", f"s{i}", "x" * 500) for i in range(MAX_LISTED_SERVERS + 5)]
    manual = render_manual(servers, [f"problem {i}" for i in range(30)])
    assert "... and 5 more" in manual and "... and 20 more" in manual
    assert len(manual) < 20_000


@pytest.mark.anyio
async def test_the_manual_from_a_hub_shows_no_secret(tmp_path: Path) -> None:
    env = write_home(tmp_path, SERVERS, broken=True)
    async with Hub(load_settings(env), env=env) as hub:
        lines = [ServerLine(s["name"], s["alias"], s["description"]) for s in hub.summaries()]
        manual = render_manual(lines, hub.problems())
    assert "`time` as `mcp_time`" in manual and "`Remote Docs` as `mcp_remote_docs`" in manual
    assert "Search the team's docs" in manual
    assert "~/MCPs/broken.json: not valid JSON" in manual and "launch kernelbridge itself" in manual
    for secret in (SECRET, "secret-path", "docs.example", "Bearer"):
        assert secret not in manual


def hub_line(env: dict[str, str]) -> str:
    lines: list[str] = []
    doctor = Doctor(load_settings(env), lines.append, env=env)
    anyio.run(doctor.check, "hub", doctor.hub_check)
    (line,) = lines
    return line


def test_doctor_hub_line(tmp_path: Path) -> None:
    line = hub_line(write_home(tmp_path / "a", SERVERS))
    assert line.split()[:2] == ["warn", "hub"]  # the self-launching entry was skipped
    assert "2 host MCP servers configured: time, Remote Docs" in line
    assert "launch kernelbridge itself" in line and SECRET not in line
    env = write_home(tmp_path / "b", {"time": SERVERS["time"]})
    assert hub_line(env).split(None, 2) == ["ok", "hub", "1 host MCP server configured: time (from ~/MCPs 1)"]
    denied = hub_line({**env, "KERNELBRIDGE_DENY_SERVERS": "time"})
    assert "no host MCP servers configured" in denied and "1 denied by the operator" in denied
    broken = write_home(tmp_path / "c", {}, broken=True)
    assert "skipped: ~/MCPs/broken.json: not valid JSON" in hub_line(broken)
