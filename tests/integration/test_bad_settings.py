"""A bad setting does not kill the bridge (issue 23): an MCP client shows none of its stderr, only
"Connection closed". ``kernelbridge serve`` over stdio answers ``initialize`` and ``tools/list``,
each ``run_python`` answers one line naming the setting and what is wrong (as a missing image
does), nothing touches the state directory, and ``doctor`` lists every bad setting. The real
``mcp`` SDK client over stdio spawning the real console script."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import KERNELBRIDGE, serve_params
from mcp.client.client import Client

pytestmark = pytest.mark.anyio

CLIENT_TIMEOUT = 60.0


@pytest.fixture
def socket_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory holding a listening unix socket (as an agent's or an engine's would be)."""
    directory = tmp_path / "with-socket"
    directory.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(directory / "agent.sock"))
    server.listen(1)
    yield directory
    server.close()


async def answers(state: Path, *args: str, **env: str) -> tuple[list[str], str, str]:
    """Spawn ``kernelbridge serve ARGS`` with ``env``: the tools it lists, one ``run_python``'s text
    (an error) and the capabilities manual."""
    async with Client(serve_params(state, *args, **env), read_timeout_seconds=CLIENT_TIMEOUT) as client:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        with anyio.fail_after(CLIENT_TIMEOUT):
            result = await client.call_tool("run_python", {"code": "print(1)"})
        manual = (await client.read_resource("kernelbridge://capabilities")).contents[0]
    assert result.is_error, result
    text = "\n".join(block.text for block in result.content if block.type == "text").strip()
    return tools, text, getattr(manual, "text", "")


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        (
            {"KERNELBRIDGE_MOUNTS": "/nowhere/at/all:/data"},
            (),
            "KERNELBRIDGE_MOUNTS: '/nowhere/at/all' does not exist",
        ),
        ({"KERNELBRIDGE_MOUNTS": "/proc:/data"}, (), "KERNELBRIDGE_MOUNTS: '/proc' is /proc"),
        ({"KERNELBRIDGE_MAX_SESSIONS": "many"}, (), "KERNELBRIDGE_MAX_SESSIONS='many' is not an integer"),
        ({"MCP_BRIDGE_MAX_SESSIONS": "0"}, (), "MCP_BRIDGE_MAX_SESSIONS='0' must be at least 1"),
        ({"KERNELBRIDGE_DENY_TOOLS": "delete"}, (), "KERNELBRIDGE_DENY_TOOLS: 'delete' is not a server.tool"),
        (
            {"KERNELBRIDGE_PACKAGES": "--index-url"},
            (),
            "KERNELBRIDGE_PACKAGES: '--index-url' is not a package",
        ),
        ({"KERNELBRIDGE_IMAGE_PACKAGES": "-r /etc/passwd"}, (), "not a package requirement"),
        (
            {"KERNELBRIDGE_IMAGE_PROFILE": "tiny"},
            (),
            "KERNELBRIDGE_IMAGE_PROFILE='tiny': expected full or minimal",
        ),
        ({"KERNELBRIDGE_RUNTIME": "lxc"}, (), "KERNELBRIDGE_RUNTIME='lxc': expected podman or docker"),
        ({}, ("--mount", "nocolon"), "--mount: 'nocolon' is not SRC:DST"),
    ],
)
async def test_a_bad_setting_is_said_by_every_call_of_a_bridge_that_answers(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...], expected: str
) -> None:
    state = tmp_path / "state"
    tools, text, manual = await answers(state, *args, **env)
    assert tools[0] == "run_python" and "close_session" in tools
    assert expected in text and "\n" not in text, text
    assert "kernelbridge is misconfigured: " in text and "restart" in text, text
    assert "Sandboxes cannot start right now: kernelbridge is misconfigured" in manual
    # Its directories may be made (the state directory is checked), but nothing is written there.
    assert not [path for path in state.rglob("*") if not path.is_dir()], list(state.rglob("*"))


async def test_every_bad_setting_is_counted_and_a_bad_state_directory_too(
    tmp_path: Path, socket_dir: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    _, text, _ = await answers(
        blocker / "state",
        "--mount",
        f"{socket_dir}:/data",
        KERNELBRIDGE_WARM_POOL="-1",
        KERNELBRIDGE_APPROVE_TOOLS="nodot",
    )
    assert "KERNELBRIDGE_WARM_POOL='-1' must be at least 0" in text, text
    assert "(and 3 more bad settings)" in text, text  # approve tools, the socket, the state directory


def test_doctor_lists_every_bad_setting_and_fails(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"),
        "KERNELBRIDGE_MAX_SESSIONS": "many",
        "KERNELBRIDGE_MOUNTS": "/etc:/data",
    }
    result = subprocess.run(
        [str(KERNELBRIDGE), "doctor"], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    assert result.returncode == 1, result.stdout + result.stderr
    settings = [line for line in result.stdout.splitlines() if line.split()[1:2] == ["settings"]]
    assert len(settings) == 2 and all(line.startswith("FAIL") for line in settings), result.stdout
    assert "KERNELBRIDGE_MAX_SESSIONS='many'" in settings[0] and "'/etc' is /etc" in settings[1]
    assert "FAILED: settings" in result.stdout.splitlines()[-1]


def test_other_commands_still_stop_at_a_bad_setting_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"), "KERNELBRIDGE_MAX_SESSIONS": "x"}
    result = subprocess.run(
        [str(KERNELBRIDGE), "sessions"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "kernelbridge: KERNELBRIDGE_MAX_SESSIONS='x' is not an integer"
