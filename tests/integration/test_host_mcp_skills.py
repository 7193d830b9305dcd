"""Saved tools end to end: a sandbox saves a function that calls a host tool, a later session
imports it explicitly (never automatically), and a person reviews and removes it with
``kernelbridge skills list|show|rm``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from peers.host_bridge import (
    KERNELBRIDGE,
    HostConfig,
    free_port,
    open_bridge,
    peers_missing,
    printed,
    run,
    write_host_config,
)

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

SAVE = '''
import json

async def utc_now():
    """The current UTC time, from the host's time server."""
    answer = await mcp_time.get_current_time(timezone="UTC")
    return answer["structuredContent"]["datetime"]

print(json.dumps([save_tool(utc_now), runtime.list_skills()[0]["name"]]))
'''

USE = """
import json
before = "utc_now" in globals()
from mcp.skills import utc_now
print(json.dumps([before, (await utc_now())[-6:], utc_now.__doc__]))
"""

GONE = """
import json
try:
    from mcp.skills import utc_now
except ModuleNotFoundError as exc:
    print(json.dumps(str(exc)))
"""


@pytest.fixture
def host(tmp_path: Path, sandbox_image: str) -> Iterator[HostConfig]:
    if why := peers_missing():
        pytest.skip(why)
    port = free_port()
    config = write_host_config(tmp_path, f"http://127.0.0.1:{port}/mcp")
    yield config  # the remote edge server is not used here: nothing listens on the port


def skills_cli(host: HostConfig, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(host.state_dir)}
    return subprocess.run(
        [str(KERNELBRIDGE), "skills", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


async def test_save_in_one_session_import_in_another_review_and_remove(host: HostConfig) -> None:
    async with open_bridge(host) as bridge:
        saved = printed(await run(bridge, SAVE, session="writer", servers=["time"]))
        assert saved[0].startswith("saved tool 'utc_now'") and saved[1] == "utc_now"
        used = printed(await run(bridge, USE, session="reader", servers=["time"]))
        assert used == [False, "+00:00", "The current UTC time, from the host's time server."]

        stored = host.state_dir / "skills" / "utc_now.py"
        assert (await anyio.Path(stored).stat()).st_mode & 0o777 == 0o600
        listed = skills_cli(host, "list")
        assert listed.returncode == 0 and "utc_now" in listed.stdout
        assert "The current UTC time, from the host's time server." in listed.stdout
        shown = skills_cli(host, "show", "utc_now")
        assert shown.returncode == 0 and shown.stdout.startswith("async def utc_now():")
        assert "save_tool" not in shown.stdout  # the function's own source only
        removed = skills_cli(host, "rm", "utc_now")
        assert (removed.returncode, removed.stdout) == (0, "removed utc_now\n")

        gone = printed(await run(bridge, GONE, session="late"))
        assert gone.startswith("No saved tool named 'utc_now'")
        for session in ("writer", "reader", "late"):
            await bridge.call_tool("close_session", {"session": session})
    again = skills_cli(host, "rm", "utc_now")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == "kernelbridge: no saved tool named 'utc_now' (see `kernelbridge skills list`)\n"
    assert skills_cli(host, "show", "utc_now").stderr.startswith("kernelbridge: no skill named 'utc_now'")
    assert skills_cli(host, "list").stdout == "no saved tools\n"
