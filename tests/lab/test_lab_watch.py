"""A person watches the agent in JupyterLab (`kernelbridge lab`, issue 22): the agent's cells and
plots appear in a console of its kernel as they run, the person's own cells run in that kernel
(journalled as theirs), an HTTP token's lab lists that tenant's sessions only, and bad input (no
token, a session closed meanwhile, a shutdown from the page) gets one line and loses nothing.

Real parts: `kernelbridge serve` (stdio and --http) with real sandboxes, the real `kernelbridge
lab`, and Debian's chromium driven headless; what is asserted is what the page shows.
"""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import anyio
import nbformat
import pytest
from bridge_harness import KERNELBRIDGE, Result, open_bridge, open_http_bridge
from lab_page import (
    console_cells,
    elements,
    open_from_running,
    open_lab,
    running_items,
    text_of,
    type_in_console,
    until,
)

# A bridge, a lab and a browser start in each test: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.slow, pytest.mark.timeout(600)]

SEEN_WITHIN = 15.0
"""Bound on the agent's cell reaching the page once its MCP call has returned."""
PLOT = """\
import matplotlib.pyplot as plt
agent_marker = "plotted"
plt.plot([1, 3, 2])
plt.title("the agent's plot")
plt.show()
print("the agent's output")
"""


def cell_with(driver: object, code: str, *, images: bool = False, output: str = "") -> dict | None:
    for cell in console_cells(driver):
        if code in cell["code"] and (cell["images"] or not images) and output in cell["output"]:
            return cell
    return None


async def open_console(browser: object, lab_url: str, session: str) -> None:
    """The lab's page, then the console of ``session`` from the Running panel, connected (its
    kernel's banner shown)."""
    await open_lab(browser, lab_url)
    await open_from_running(browser, session)
    await until(
        lambda: [e for e in elements(browser, ".jp-CodeConsole-banner") if "Python" in text_of(e)],
        f"the console of {session!r} connected to its kernel",
        browser,
    )


async def export(state: Path, session: str, target: Path) -> nbformat.NotebookNode:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state)}
    done = await anyio.run_process([str(KERNELBRIDGE), "export", session, "-o", str(target)], env=env)
    assert done.returncode == 0, done.stderr
    return nbformat.read(target, as_version=4)


async def test_a_person_watches_the_agent_and_works_in_its_kernel(
    browser, lab_of, tmp_path: Path, sandbox_image: str
) -> None:
    state = tmp_path / "state"
    async with open_bridge(state) as bridge:
        first = await bridge.run("started = 'by the agent'", "watched")
        assert first.status == "ok", first.text
        async with lab_of(state) as lab:
            await open_console(browser, lab.url, "watched")

            plotted = await bridge.run(PLOT, "watched")
            assert plotted.status == "ok", plotted.text
            cell = await until(
                lambda: cell_with(
                    browser, 'agent_marker = "plotted"', images=True, output="the agent's output"
                ),
                "the agent's cell with its plot",
                browser,
                timeout=SEEN_WITHIN,
            )
            assert cell["images"][0].startswith("data:image/png;base64,"), cell

            await type_in_console(browser, "from_page = started.upper()")
            await until(
                lambda: cell_with(browser, "from_page = started.upper()") and not busy(browser),
                "the person's cell run",
                browser,
            )
            seen = await bridge.run("print(from_page)", "watched")
            assert seen.stdout == "BY THE AGENT\n", seen.text

            # The page's interrupt stops the agent's running cell (as Ctrl-C in a console would).
            kernel = json.loads(lab.api("/api/kernels")[1])[0]
            long_run: list[Result] = []
            returned = anyio.Event()
            async with anyio.create_task_group() as tg:

                async def agent_sleeps() -> None:
                    long_run.append(await bridge.run("import time\ntime.sleep(120)", "watched", timeout=180))
                    returned.set()

                tg.start_soon(agent_sleeps)
                await until(lambda: cell_with(browser, "time.sleep(120)"), "the agent's long cell", browser)
                status, body = lab.api(f"/api/kernels/{kernel['id']}/interrupt", method="POST")
                assert status == 204, body
                with anyio.fail_after(30):
                    await returned.wait()
            assert "KeyboardInterrupt" in long_run[0].text, long_run[0].text

            # The page's shutdown is refused: the session is the agent's.
            status, body = lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
            assert status == 403, body
            assert "belongs to the agent" in json.loads(body)["message"], body
        # The lab stopped: the session runs on, the person's variable in it.
        after = await bridge.run("print(from_page, agent_marker)", "watched")
        assert after.stdout == "BY THE AGENT plotted\n", after.text

    nb = await export(state, "watched", tmp_path / "watched.ipynb")
    sources = [(c.source, c.metadata["kernelbridge"]["source"]) for c in nb.cells]
    assert sources == [
        ("started = 'by the agent'", "mcp"),
        (PLOT, "mcp"),
        ("from_page = started.upper()", "client"),
        ("print(from_page)", "mcp"),
        ("import time\ntime.sleep(120)", "mcp"),
        ("print(from_page, agent_marker)", "mcp"),
    ], sources
    person = nb.cells[2].metadata["kernelbridge"]["client"]["username"]
    assert person == pwd.getpwuid(os.getuid()).pw_name


def busy(driver: object) -> bool:
    """A console cell still waiting for its kernel (JupyterLab's prompt reads ``[*]:``)."""
    return any("[*]" in text_of(p) for p in elements(driver, ".jp-CodeConsole-content .jp-InputPrompt"))


async def test_an_http_tenants_lab_lists_its_own_sessions_only(
    browser, lab_of, tmp_path: Path, sandbox_image: str
) -> None:
    state = tmp_path / "state"
    tokens = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}
    async with open_http_bridge(state, tokens) as bridges:
        assert (await bridges["alice"].run("mine = 1", "alice-work")).status == "ok"
        assert (await bridges["bob"].run("theirs = 2", "bob-private")).status == "ok"
        tokens_env = ",".join(f"{name}:{token}" for name, token in tokens.items())
        async with lab_of(state, "--token", "alice", KERNELBRIDGE_HTTP_TOKENS=tokens_env) as lab:
            await open_lab(browser, lab.url)
            await open_from_running(browser, "alice-work")  # listed, and its console opens
            await until(
                lambda: [e for e in elements(browser, ".jp-CodeConsole-banner") if "Python" in text_of(e)],
                "alice's console",
                browser,
            )
            listed = await running_items(browser)
            assert "alice-work" in listed and "alice-work.ipynb" in listed, listed
            assert not [item for item in listed if "bob" in item], listed
            files = elements(browser, 'li[data-id="filebrowser"]')
            files[0].click()
            names = await until(
                lambda: [text_of(e) for e in elements(browser, ".jp-DirListing-itemText")] or None,
                "the file browser's listing",
                browser,
            )
            assert names == ["alice-work.ipynb"], names
            assert "bob" not in lab.api("/api/sessions")[1]


async def test_bad_input_gets_one_line_and_loses_nothing(
    browser, lab_of, tmp_path: Path, sandbox_image: str
) -> None:
    state = tmp_path / "state"
    async with open_bridge(state) as bridge:
        assert (await bridge.run("kept = 'journalled'\nprint(kept)", "short")).status == "ok"
        async with lab_of(state) as lab:
            # Without the token: jupyter_server's login page, and nothing of the sessions.
            browser.get(lab.base + "/lab")
            login = await until(
                lambda: [e for e in elements(browser, "body") if "token" in text_of(e).lower()],
                "the login page",
                browser,
            )
            assert "short" not in text_of(login[0])
            assert lab.api("/api/kernels", token="a-wrong-token-000000")[0] == 403

            # A cell of the person's still running when the agent closes the session.
            await open_console(browser, lab.url, "short")
            await type_in_console(browser, "import time; time.sleep(120)")
            await until(lambda: busy(browser), "the person's cell running", browser)
            await bridge.close("short")
            gone = await until(  # within PAGE_WAIT, half the cell's sleep: not when it ended
                lambda: cell_with(browser, "time.sleep(120)", output="was closed"),
                "the line for the closed session",
                browser,
            )
            assert "kernelbridge lab: session 'short' was closed" in gone["output"], gone
            assert gone["output"].count("kernelbridge lab:") == 1, gone

            # A cell typed after that: the same one line, at once; nothing is sent anywhere.
            await type_in_console(browser, "print('after the close')")
            again = await until(
                lambda: cell_with(browser, "after the close", output="was closed"), "the line again", browser
            )
            assert "this cell did not run" in again["output"], again

            # What was journalled is all there: the session's notebook in the page.
            browser.get(f"{lab.base}/lab/tree/short.ipynb?token={lab.token}")
            await until(
                lambda: [
                    e
                    for e in elements(browser, ".jp-Notebook .jp-Cell")
                    if "kept = 'journalled'" in text_of(e)
                ],
                "the closed session's notebook",
                browser,
            )
    nb = await export(state, "short", tmp_path / "short.ipynb")
    assert nb.cells[0].source == "kept = 'journalled'\nprint(kept)"
    assert nb.cells[0].outputs[0]["text"] == "journalled\n"
