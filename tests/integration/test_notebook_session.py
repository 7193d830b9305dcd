"""A session is one notebook, whoever ran its cells, and it survives a SIGKILL of the bridge.

Real parts only: ``kernelbridge serve`` over stdio with the MCP SDK's client, a second real
Jupyter client (jupyter_client's AsyncKernelClient on the session's connection file, as
``kernelbridge attach`` would connect), real sandboxes, nbclient through the installed
``kernelbridge`` kernelspec, and the ``kernelbridge`` console script for export and replay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from bridge_harness import notebook_of
from jupyter_client.asynchronous.client import AsyncKernelClient
from nbclient import NotebookClient

from kernelbridge.config import load_settings
from kernelbridge.jupyter import install_kernelspec
from kernelbridge.replay import behaviour, judge
from kernelbridge.runtime import cli_runtime, reap_orphans
from kernelbridge.session.store import SessionStore, list_session_records

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
SECOND_CLIENT_CODE = "y = f(x) + 1\nprint('typed in a console:', y)"


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def cli(state: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KERNELBRIDGE), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(state), **(env or {})},
        check=False,
    )


async def run_from_second_client(connection_file: str, code: str) -> dict[str, Any]:
    """Execute ``code`` as another Jupyter client of the same kernel; returns the reply content."""
    client = AsyncKernelClient()
    client.load_connection_file(connection_file)
    client.session.username = "person"
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        msg_id = client.execute(code)
        while True:
            reply = await client.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]
    finally:
        client.stop_channels()


async def test_an_mcp_session_and_a_second_client_make_one_notebook_that_replays(
    connect: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    with anyio.fail_after(300):
        async with connect(state) as client:
            first = await client.call_tool("run_python", {"code": "import math\nx = 40"})
            second = await client.call_tool("run_python", {"code": "def f(v):\n    return v + 2"})
            third = await client.call_tool("run_python", {"code": "print(f(x))\nmath.pi > 3"})
            for result in (first, second, third):
                assert result.is_error is False, text_of(result)
            (record,) = [r for r in list_session_records(state) if r["name"] == "default"]
            reply = await run_from_second_client(record["connection_file"], SECOND_CLIENT_CODE)
            assert reply["status"] == "ok", reply
            seen = await client.call_tool("run_python", {"code": "y"})
            assert seen.structured_content["result"] == "43"
            exported = await notebook_of(client, "default")

    nb = nbformat.reads(exported, as_version=4)
    nbformat.validate(nb)
    sources = [cell.source for cell in nb.cells]
    assert sources == ["import math\nx = 40", "def f(v):\n    return v + 2", "print(f(x))\nmath.pi > 3",
                       SECOND_CLIENT_CODE, "y"]  # fmt: skip
    marks = [cell.metadata.kernelbridge["source"] for cell in nb.cells]
    assert marks == ["mcp", "mcp", "mcp", "client", "mcp"]
    assert nb.cells[3].metadata.kernelbridge["client"]["username"] == "person"
    assert nb.cells[3].outputs[0]["text"] == "typed in a console: 43\n"
    assert [cell.execution_count for cell in nb.cells] == [1, 2, 3, 4, 5]
    path = tmp_path / "session.ipynb"
    nbformat.write(nb, path)

    # Executed again by nbclient through the installed kernelspec: every cell behaves the same.
    install_kernelspec(prefix=str(tmp_path / "prefix"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "prefix" / "share" / "jupyter"))
    monkeypatch.setenv("KERNELBRIDGE_STATE_DIR", str(tmp_path / "nbclient-state"))
    again = nbformat.read(path, as_version=4)
    await NotebookClient(again, kernel_name="kernelbridge", timeout=60, startup_timeout=120).async_execute()
    for n, (was, now) in enumerate(zip(nb.cells, again.cells, strict=True), 1):
        assert judge(n, behaviour(was.outputs), behaviour(now.outputs)).verdict == "same", (was, now)

    # And by kernelbridge replay: all same, exit status 0.
    replayed = cli(tmp_path / "replay-state", "replay", str(path), "--strict")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert replayed.stdout.splitlines()[-1].endswith(": 5 same, 0 different, 0 error, 0 skipped")


def _exists(pid: int) -> bool:
    """Whether ``pid`` runs (neither gone nor a zombie); it may be reaped between the two looks."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


async def test_the_journal_survives_a_sigkill_of_the_bridge_losing_only_the_cell_in_flight(
    connect: Any, kb: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with anyio.fail_after(240):
        async with connect(state) as client:
            await client.call_tool("run_python", {"code": "a = 1\nprint('one')"})
            await client.call_tool("run_python", {"code": "b = a + 1\nb"})
            (pid,) = kb.serve_pids(state)
            started = anyio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                if message and "started" in message:
                    started.set()

            async def in_flight() -> None:
                code = "import time\nprint('started', flush=True)\ntime.sleep(60)"
                try:
                    await client.call_tool("run_python", {"code": code}, progress_callback=on_progress)
                except Exception:
                    pass  # the server is gone: any transport error

            async with anyio.create_task_group() as tg:
                tg.start_soon(in_flight)
                await started.wait()  # the kernel runs the third cell: it is in flight
                os.kill(pid, signal.SIGKILL)
                while _exists(pid):  # noqa: ASYNC110 - another process: no event to wait on
                    await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True), anyio.fail_after(60):
            await reap_orphans(cli_runtime(load_settings({"KERNELBRIDGE_STATE_DIR": str(state)})))

    lines = SessionStore(state).journal("default").read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line whole: none torn by the kill
    assert [e["type"] for e in entries] == ["session", "cell", "cell"]
    out = tmp_path / "after-kill.ipynb"
    exported = cli(state, "export", "default", "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == ["a = 1\nprint('one')", "b = a + 1\nb"]
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "2"


async def test_restore_rebuilds_a_session_from_a_notebook_with_a_report(mcp_client: Any) -> None:
    async def run(code: str, session: str, **args: Any) -> Any:
        return await mcp_client.call_tool("run_python", {"code": code, "session": session, **args})

    with anyio.fail_after(180):
        for code in ("config = {'n': 3}", "total = sum(range(config['n']))\nprint(total)", "1 / 0"):
            await run(code, "orig")
        written = await mcp_client.call_tool("export_notebook", {"session": "orig", "path": "orig.ipynb"})
        assert written.is_error is False, text_of(written)
        restored = await run("", "copy", restore="kernelbridge://sessions/orig/notebook")
        after = await run("total", "copy")
        both = await run("total * 2", "copy2", restore="orig.ipynb")
        again = await run("", "copy", restore="orig.ipynb")
        outside = await run("", "copy3", restore="../orig.ipynb")
        absolute = await run("", "copy3", restore="/etc/hosts.ipynb")
        missing = await run("", "copy3", restore="kernelbridge://sessions/nobody/notebook")

    assert restored.is_error is False, text_of(restored)
    lines = text_of(restored).splitlines()
    assert lines[:3] == ["cell   1  same", "cell   2  same", "cell   3  same"]
    assert lines[3] == "replayed 3 code cells in session 'copy': 3 same, 0 different, 0 error, 0 skipped"
    assert restored.structured_content["restore"]["counts"]["same"] == 3
    assert after.structured_content["result"] == "3"
    assert both.structured_content["result"] == "6" and "cell   3  same" in text_of(both)
    assert again.is_error is True and "is open" in text_of(again)
    assert outside.is_error is True and "exports directory" in text_of(outside)
    assert absolute.is_error is True and "exports directory" in text_of(absolute)
    assert missing.is_error is True and "no journal" in text_of(missing)
