"""The README's host tools, approval, notebooks and attach workflows, combined, at the defaults.

A user whose ``~/.claude.json`` names mcp-server-time and a second server whose ``echo`` tool
needs their approval (``KERNELBRIDGE_APPROVE_TOOLS``: the one setting this journey is about, in
their client entry) works with both; a person attaches ``jupyter console`` to the agent's live
session and the agent sees what they did; the client restarts and the session is adopted with
its grants; the notebook is exported and replayed offline by ``kernelbridge replay``, every
cell the same, the host calls answered from the recording.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import nbformat
import pytest
from journey import TIME_SERVER, User, client_of, new_user, warm_pool_ready

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.journey]

EDGE = Path(__file__).resolve().parents[1] / "peers" / "edge_server.py"
TOOLS = (
    "t = await mcp_time.get_current_time(timezone='UTC')\n"
    "zone = json.loads(t['content'][0]['text'])['timezone']\n"
    "echoed = (await mcp_edge.echo(text='approved?'))['content'][0]['text']\n"
    "print(zone, echoed)"
)


class Person:
    """The MCP client's elicitation callback: a person who approves, and what they were asked."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params)
        return types.ElicitResult(action="accept")


@pytest.fixture
def user(tmp_path: Path, sandbox_image: str) -> User:
    # The setting this journey is about: the user's client entry asks for approval of edge.echo.
    person = new_user(tmp_path, KERNELBRIDGE_APPROVE_TOOLS="edge.echo")
    person.claude_json({"time": TIME_SERVER, "edge": {"command": sys.executable, "args": [str(EDGE)]}})
    return person


async def test_tools_approval_attach_restart_export_and_replay(user: User, tmp_path: Path) -> None:
    person = Person()
    async with client_of(user, elicitation_callback=person) as bridge:
        await warm_pool_ready(bridge)
        called = await bridge.run("import json\n" + TOOLS, "work", servers=["time", "edge"])
        assert called.status == "ok" and called.stdout == "UTC approved?\n", called.text
        assert len(person.asked) == 1 and "edge.echo" in str(person.asked[0]), person.asked

        # A person looks in with `kernelbridge attach` and leaves a variable for the agent.
        _, printed, _ = await user.cli("attach", "work", "--print")
        assert await anyio.Path(printed.strip()).is_file()
        _, console, _ = await user.cli("attach", "work", stdin="print('seen', zone)\nfrom_person = 7\n")
        assert "seen UTC" in console, console
        seen = await bridge.run("from_person * 6", "work")
        assert seen.data["result"] == "42", seen.text

    # The client restarts: the session is adopted with its variables and its grants.
    async with client_of(user, elicitation_callback=person) as bridge:
        again = await bridge.run(TOOLS, "work")
        assert again.status == "ok" and again.stdout == "UTC approved?\n", again.text
        assert "adopted" in again.codes and again.data["state"] == "kept", again.text
        assert len(person.asked) == 2
        error, said = await bridge.call("export_notebook", session="work", path="work.ipynb")
        assert not error, said

    exported = user.state_dir / "exports" / "work.ipynb"
    notebook = nbformat.read(exported, as_version=4)
    nbformat.validate(notebook)
    sources = [cell.metadata["kernelbridge"]["source"] for cell in notebook.cells]
    assert sources == ["mcp", "client", "client", "mcp", "mcp"], sources
    who = notebook.cells[1].metadata["kernelbridge"]["client"]["username"]
    assert who == pwd.getpwuid(os.getuid()).pw_name
    calls = notebook.cells[0].metadata["kernelbridge"]["tool_calls"]
    assert [(c["server"], c["tool"]) for c in calls] == [("time", "get_current_time"), ("edge", "echo")]

    # Replayed offline: the host calls come from the recording (no server runs, nobody is asked).
    out = tmp_path / "out.ipynb"
    status, report, err = await user.cli("replay", str(exported), "-o", str(out), check=False)
    assert status == 0, report + err
    lines = [line for line in report.splitlines() if line.startswith("cell ")]
    assert len(lines) == 5 and all(" same" in line for line in lines), report
    assert len(person.asked) == 2
    replayed = nbformat.read(out, as_version=4)
    assert json.dumps(replayed.cells[0].outputs).count("UTC approved?") == 1

    async with client_of(user) as bridge:
        error, said = await bridge.call("close_session", session="work")
        assert not error, said
