"""A bridge SIGKILLed while it writes an export (``export_notebook(path=...)``): the file the model
asked for is the earlier export, whole, never a torn one; nothing half-written is left beside it
or in the bridge's scratch directory once the next bridge exports; and the next bridge exports
the same session again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import anyio
import nbformat
import pytest
from bridge_harness import Bridge, open_bridge
from peers.hostile_cells import BIG_CELL

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

KILL_WAIT = 120.0
"""Longest the test looks for the export's file in the bridge's descriptors."""


def open_in(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` has a file below ``directory`` open (an export being written there:
    a named temporary file, or an unnamed one, shown as ``<dir>/#<inode> (deleted)``)."""
    prefix = str(directory) + os.sep
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


async def kill_while_writing(bridge: Bridge, exports: Path) -> None:
    """SIGKILL the bridge as soon as it writes below ``exports`` (polled, bounded)."""
    deadline = time.monotonic() + KILL_WAIT
    while not open_in(bridge.pid, exports):
        assert time.monotonic() < deadline, "the export never began writing its file"
        await anyio.sleep(0.001)  # a copy of ~48 MiB takes tens of milliseconds: polled often enough
    os.kill(bridge.pid, signal.SIGKILL)


async def test_a_bridge_killed_mid_export_leaves_the_earlier_file_whole(tmp_path: Path) -> None:
    state = tmp_path / "state"
    exports, scratch = state / "exports", state / "run" / "exports"
    target = exports / "big.ipynb"
    async with open_bridge(state) as bridge:
        assert (await bridge.run("print('first')", "big")).status == "ok"
        failed, _ = await bridge.call("export_notebook", session="big", path="big.ipynb")
        assert not failed
    earlier = target.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - the client loses its server: any error
        async with open_bridge(state) as bridge:
            for _ in range(4):  # ~48 MiB of images: the export takes a while to write
                assert (await bridge.run(BIG_CELL, "big", timeout=120)).status == "ok"
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_while_writing, bridge, exports)
                await bridge.call("export_notebook", session="big", path="big.ipynb")
    # Where the model asked for the file: the earlier export, whole, and nothing beside it.
    assert target.read_bytes() == earlier
    nbformat.validate(nbformat.reads(earlier.decode(), as_version=4))
    assert sorted(p.name for p in exports.iterdir()) == ["big.ipynb"]

    async with open_bridge(state) as bridge:
        answer = await bridge.client.call_tool("export_notebook", {"session": "big", "path": "big.ipynb"})
        summary = answer.structured_content or {}
    assert not answer.is_error, answer
    assert summary["file"] == str(target) and summary["bytes"] == target.stat().st_size > 40 << 20
    notebook = json.loads(target.read_text())  # complete JSON (nbformat.reads of 48 MiB is slow)
    # One generation of "big": the durable sandbox went from bridge to bridge (adopted twice), so
    # the first bridge's cell and the killed bridge's four are all in it.
    assert len(notebook["cells"]) == summary["cells"] == 5
    # The dead bridge's scratch file went with the next export; nothing else is left.
    assert sorted(p.name for p in exports.iterdir()) == ["big.ipynb"]
    assert list(scratch.iterdir()) == []
