"""The CLI beside a running bridge: `sessions`, `attach` (jupyter console) and `export` see the
live sessions of a `kernelbridge serve` driven by a real MCP client."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import anyio
import nbformat
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")


async def cli(
    state_dir: Path, *args: str, stdin: str | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state_dir)}
    for name in unset:
        env.pop(name, None)
    with anyio.fail_after(120):
        return await anyio.run_process(
            [str(KERNELBRIDGE), *args], input=stdin.encode() if stdin else None, env=env, check=False
        )


async def test_sessions_attach_and_export_see_a_live_session(connect, tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with connect(state_dir=state) as client:
        made = await client.call_tool(
            "run_python", {"code": "secret = 'made by the agent'", "session": "look"}
        )
        assert not made.is_error

        listed = await cli(state, "sessions", "--json")
        records = json.loads(listed.stdout)
        assert [r["name"] for r in records] == ["look"]

        printed = await cli(state, "attach", "look", "--print")
        assert printed.stdout.decode().strip() == records[0]["connection_file"]

        # A human's `jupyter console --existing` on the same sandbox sees the agent's state, and
        # what the human does is visible to the agent. End of input (Ctrl-D) leaves the kernel
        # running; typing `exit` would stop it, as for any shared Jupyter kernel.
        # $USER unset: jupyter_client would call the person "username"; attach names them.
        console = await cli(state, "attach", "look", stdin="print(secret)\nhuman = 1\n", unset=("USER",))
        assert "made by the agent" in console.stdout.decode(), console.stdout + console.stderr
        seen = await client.call_tool("run_python", {"code": "human", "session": "look"})
        assert seen.structured_content["result"] == "1", seen.structured_content

        exported = await cli(state, "export", "look", "-o", str(tmp_path / "look.ipynb"))
        assert exported.returncode == 0, exported.stderr
    nb = nbformat.read(tmp_path / "look.ipynb", as_version=4)
    nbformat.validate(nb)
    # The console's cells are part of the record too, marked as another client's.
    assert [c.source for c in nb.cells] == [
        "secret = 'made by the agent'",
        "print(secret)",
        "human = 1",
        "human",
    ]
    sources = [c.metadata["kernelbridge"]["source"] for c in nb.cells]
    assert sources == ["mcp", "client", "client", "mcp"]
    assert nb.cells[1].outputs[0]["text"] == "made by the agent\n"
    assert nb.cells[1].metadata["kernelbridge"]["client"]["username"] == pwd.getpwuid(os.getuid()).pw_name


async def test_attach_to_an_unknown_session_is_a_one_line_error(tmp_path: Path) -> None:
    result = await cli(tmp_path / "state", "attach", "nope")
    assert result.returncode == 1
    assert (
        result.stderr.decode().strip()
        == "kernelbridge: no live session named 'nope' (see `kernelbridge sessions`)"
    )


async def test_export_notebook_names_an_older_generation_and_the_bare_name_the_current(
    connect, tmp_path: Path
) -> None:
    async with connect(state_dir=tmp_path / "state") as client:
        await client.call_tool("run_python", {"code": "print('first life')", "session": "g"})
        await client.call_tool("close_session", {"session": "g"})
        await client.call_tool("run_python", {"code": "print('second life')", "session": "g"})
        current = await client.call_tool("export_notebook", {"session": "g", "path": "current.ipynb"})
        older = await client.call_tool("export_notebook", {"session": "g@1", "path": "older.ipynb"})
        missing = await client.call_tool("export_notebook", {"session": "g@9"})
        forged = await client.call_tool("export_notebook", {"session": "../g@1"})
    text = {name: "\n".join(b.text for b in r.content if b.type == "text") for name, r in
            (("missing", missing), ("forged", forged))}  # fmt: skip
    exports = tmp_path / "state" / "exports"
    written = {name: (exports / f"{name}.ipynb").read_text() for name in ("current", "older")}
    assert "second life" in written["current"] and "first life" not in written["current"]
    assert "first life" in written["older"] and "second life" not in written["older"]
    assert not current.is_error and current.structured_content["cells"] == 1
    assert older.structured_content["resource"] == "kernelbridge://sessions/g@1/notebook"
    assert (
        missing.is_error and "no generation 9" in text["missing"] and len(text["missing"].splitlines()) == 1
    )
    assert forged.is_error and "invalid session name" in text["forged"]
