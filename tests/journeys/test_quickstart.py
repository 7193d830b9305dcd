"""The README's quickstart, as a new user meets it: every setting at its default.

Their MCP client starts ``kernelbridge serve`` (no variables but HOME and PATH); their Claude Code
config names mcp-server-time. They wait for the warm pool, work in several sessions (variables,
a plot, a file in and out, a host tool), export a notebook, quit the client, look with
``kernelbridge sessions``, start the client again and go on where they were, and again: nothing
piles up, the warm pool included.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import nbformat
import pytest
from journey import TIME_SERVER, User, client_of, new_user, until, warm_pool_ready

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.journey]

PLOT = "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2))\nplt.plot([1, 2, 3], [data['a'], 2, 1])"


@pytest.fixture
def user(tmp_path: Path, sandbox_image: str) -> User:
    person = new_user(tmp_path)
    person.claude_json({"time": TIME_SERVER})
    return person


async def test_a_first_day_with_kernelbridge(user: User) -> None:
    async with client_of(user) as bridge:
        await warm_pool_ready(bridge)
        first = await bridge.run("data = {'a': 3}\nx = 41\nx + 1", "default")
        assert first.status == "ok" and first.data["result"] == "42", first.text
        assert first.data["state"] == "kept"

        # Several sessions at once: each its own kernel.
        async with anyio.create_task_group() as tg:
            for name in ("left", "right"):
                tg.start_soon(bridge.run, f"who = {name!r}", name)
        assert (await bridge.run("who", "left")).data["result"] == "'left'"
        assert (await bridge.run("who", "right")).data["result"] == "'right'"

        plotted = await bridge.client.call_tool("run_python", {"code": PLOT, "session": "default"})
        images = [block for block in plotted.content if block.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png", plotted.content

        # A host tool from ~/.claude.json, granted to the session.
        now = await bridge.run(
            "r = await mcp_time.get_current_time(timezone='UTC')\nprint(r['content'][0]['text'][:40])",
            "default",
            servers=["time"],
        )
        assert now.status == "ok" and "UTC" in now.stdout, now.text

        placed = await bridge.run("print(open('in.csv').read())", "default", files={"in.csv": "a,b\n1,2\n"})
        assert placed.stdout == "a,b\n1,2\n\n", placed.text
        await bridge.run("open('out.txt', 'w').write('from the sandbox')", "default")
        read = await bridge.client.read_resource("kernelbridge://sessions/default/files/out.txt")
        assert read.contents[0].text == "from the sandbox"  # type: ignore[union-attr]

        listed = await bridge.listed()
        assert sorted(listed) == ["default", "left", "right"], listed
        error, said = await bridge.call("export_notebook", session="default", path="default.ipynb")
        assert not error, said
        target = user.state_dir / "exports" / "default.ipynb"  # the default export directory
        sessions_now = len(user.sandboxes())
        assert sessions_now == 4, user.sandboxes()  # three sessions and one warm sandbox

    notebook = nbformat.read(target, as_version=4)
    nbformat.validate(notebook)
    assert [cell.source for cell in notebook.cells][:1] == ["data = {'a': 3}\nx = 41\nx + 1"]
    assert any(o.get("data", {}).get("image/png") for c in notebook.cells for o in c.outputs)

    # The client quit: its sessions run on, detached, and the CLI says so in one word.
    _, shown, _ = await user.cli("sessions", "--json")
    states = {s["name"]: s["state"] for s in json.loads(shown)}
    assert states == {"default": "detached", "left": "detached", "right": "detached"}, shown
    _, table, _ = await user.cli("sessions")
    assert "warm pool: 0 sandbox(es) attached, 1 detached" in table, table

    for restart in range(3):
        async with client_of(user) as bridge:
            again = await bridge.run("x += 1\nprint(x, who if 'who' in dir() else data)", "default")
            assert again.status == "ok" and again.data["state"] == "kept", again.text
            assert again.stdout == f"{42 + restart} {{'a': 3}}\n", again.text
            assert "adopted" in again.codes, again.codes  # each restart's first call says so
            assert (await bridge.run("who", "right")).data["result"] == "'right'"
            await warm_pool_ready(bridge)
            # Nothing piles up: the same three sessions and one warm sandbox, restart after restart.
            assert len(user.sandboxes()) == 4, (restart, user.sandboxes())
            listed = await bridge.listed()  # adopted as the bridge started, before initialize
            assert {name: s["state"] for name, s in listed.items()} == dict.fromkeys(
                ("default", "left", "right"), "idle"
            ), listed

    async with client_of(user) as bridge:
        for name in ("default", "left", "right"):
            error, said = await bridge.call("close_session", session=name)
            assert not error and "closed" in said, said
    await until(lambda: len(user.sandboxes()) == 1, "only the warm sandbox is left after the closes")
    _, shown, _ = await user.cli("sessions", "--all", "--json")
    generations = {g["name"]: g["state"] for g in json.loads(shown)}
    assert generations == {"default@1": "ended", "left@1": "ended", "right@1": "ended"}, generations
