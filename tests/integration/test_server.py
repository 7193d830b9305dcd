"""`kernelbridge serve` through a real MCP client over stdio, with real sandbox containers.

The tests share the module's bridge (``shared_client``: no session is open when one begins) but
for those about a bridge's own exit, which spawn their own. Every wait is bounded with
``anyio.fail_after``.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from bridge_harness import KERNELBRIDGE, Bridge
from mcp.client.client import Client
from waiting import hang_guard

from kernelbridge.server.render import render_note
from kernelbridge.session.outcome import Stop, TimedOut

pytestmark = [pytest.mark.anyio, pytest.mark.podman]


async def run(client: Client, code: str, **args: Any) -> Any:
    return await client.call_tool("run_python", {"code": code, **args})


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def png_bytes() -> bytes:
    """A valid 1x1 PNG, built by hand (no PIL or matplotlib needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = chunk(b"IHDR", (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0]))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\0\xff\0\0")) + chunk(b"IEND", b"")


async def test_state_is_kept_across_three_calls(shared_client: Client) -> None:
    with anyio.fail_after(60):
        first = await run(shared_client, "import math\nx = 40")
        second = await run(
            shared_client,
            "def f(v):\n    return v + 2\nwith open('note.txt', 'w') as fh:\n    fh.write('hi')",
        )
        third = await run(shared_client, "print()\nprint(f(x), math.pi > 3, open('note.txt').read())\n()")
    for result in (first, second, third):
        assert result.is_error is False, text_of(result)
    sc = third.structured_content
    assert sc["status"] == "ok" and sc["state"] == "kept" and sc["session"] == "default"
    assert sc["stdout"] == "\n42 True hi\n"  # the blank line is kept verbatim
    assert sc["result"] == "()"
    assert sc["execution_count"] == 3
    assert "Out[3]: ()" in text_of(third)


async def test_errors_are_results_with_a_clean_traceback(shared_client: Client) -> None:
    with anyio.fail_after(60):
        result = await run(shared_client, "def g():\n    return 1/0\ng()")
    assert result.is_error is True
    error = result.structured_content["error"]
    assert error["ename"] == "ZeroDivisionError" and error["evalue"] == "division by zero"
    assert "\x1b" not in error["traceback"] and "\x1b" not in text_of(result)
    assert "return 1/0" in error["traceback"]
    assert result.structured_content["status"] == "error"


async def test_top_level_await(shared_client: Client) -> None:
    with anyio.fail_after(60):
        result = await run(shared_client, "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'")
    assert result.structured_content["result"] == "'awaited'"


async def test_timeout_interrupts_returns_partial_output_and_keeps_state(shared_client: Client) -> None:
    # Interrupted at its timeout: a 600 s sleep waited out would run into the hang guard.
    with hang_guard(90, "a timeout=2 cell that sleeps 600 s, and the next"):
        await run(shared_client, "kept = 'yes'")
        result = await run(
            shared_client, "import time\nprint('partial', flush=True)\ntime.sleep(600)", timeout=2
        )
        after = await run(shared_client, "kept")
    sc = result.structured_content
    assert result.is_error is True
    assert (sc["status"], sc["state"], sc["note_codes"]) == ("timeout", "kept", ["timed_out"])
    assert sc["stdout"] == "partial\n"
    # The model reads the note's sentence in the text too (its wording: test_server_render.py).
    assert render_note(TimedOut(2, Stop.INTERRUPTED)) in text_of(result)
    assert after.structured_content["result"] == "'yes'"


async def test_cell_ignoring_interrupt_forces_a_restart_reported_as_lost(shared_client: Client) -> None:
    stubborn = "\n".join(
        [
            "import time",
            "while True:",
            "    try:",
            "        time.sleep(1)",
            "    except KeyboardInterrupt:",
            "        pass",
        ]
    )
    with anyio.fail_after(120):
        await run(shared_client, "gone = 1\nopen('/workspace/stays.txt', 'w').write('file')")
        result = await run(shared_client, stubborn, timeout=2)
        after = await run(shared_client, "'gone' in globals(), open('/workspace/stays.txt').read()")
    sc = result.structured_content
    assert (sc["status"], sc["state"], sc["note_codes"]) == ("timeout", "lost", ["timed_out"])
    # Restarted in place, not discarded: the variables are gone, the file is there.
    assert after.structured_content["result"] == "(False, 'file')"
    assert after.is_error is False


async def test_png_display_arrives_as_image_content(shared_client: Client) -> None:
    png = png_bytes()
    code = f"from IPython.display import Image, display\ndisplay(Image(data={png!r}))\nprint('shown')"
    with anyio.fail_after(60):
        result = await run(shared_client, code)
    images = [block for block in result.content if block.type == "image"]
    assert len(images) == 1
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data) == png
    assert result.structured_content["stdout"] == "shown\n"


async def test_input_fails_immediately(shared_client: Client) -> None:
    with anyio.fail_after(60):
        await run(shared_client, "1")  # the kernel is started
        result = await run(shared_client, "name = input('name? ')")
    assert result.is_error is True  # an error, not a call that waited for its timeout
    assert result.structured_content["error"]["ename"] == "StdinNotImplementedError"
    assert "input() is not available" in text_of(result)


BAD_INPUT: list[tuple[dict[str, Any], str]] = [
    ({"code": ""}, "code is empty"),
    ({"code": "   \n"}, "code is empty"),
    ({"code": 5}, "run_python needs `code` as a string, not an integer"),
    ({"code": "1", "timeout": -1}, "timeout must be between 1 and 600"),
    ({"code": "1", "timeout": 10**9}, "timeout must be between 1 and 600"),
    ({"code": "1", "timeout": "soon"}, "run_python needs `timeout` as an integer, not a string"),
    ({"code": "1", "session": "../etc"}, "invalid session name"),
    ({"code": "1", "session": "a b"}, "invalid session name"),
    ({"code": "1", "session": "x" * 65}, "invalid session name"),
    ({"code": "1", "servers": ["x"]}, "unknown server 'x'; no host MCP servers are configured"),
    ({"code": "1", "servers": "x"}, "run_python needs `servers` as a list of strings, not a string"),
]


async def test_bad_input_gives_a_clear_error(shared_client: Client) -> None:
    # One server for every case: spawning one per case would cost seconds each.
    for args, message in BAD_INPUT:
        with anyio.fail_after(60):
            result = await shared_client.call_tool("run_python", args)
        text = text_of(result)
        assert result.is_error is True, args
        assert message in text, (args, text)
        assert "Traceback" not in text, (args, text)
    assert no_sessions(await shared_client.call_tool("list_sessions", {}))


def no_sessions(result: Any) -> bool:
    return json.loads(text_of(result))["sessions"] == []


async def test_progress_notifications_arrive_for_a_long_call(shared_client: Client) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    code = "import time\nfor i in range(6):\n    print('step', i, flush=True)\n    time.sleep(1)"
    with anyio.fail_after(60):
        result = await shared_client.call_tool("run_python", {"code": code}, progress_callback=on_progress)
    assert result.is_error is False
    assert len(seen) >= 2, seen
    assert seen[0][1] == 30.0
    assert [p for p, _, _ in seen] == sorted(p for p, _, _ in seen)
    assert any(message and "step" in message for _, _, message in seen)


async def test_sessions_list_close_and_export(shared_client: Client, shared_bridge: Bridge, kb: Any) -> None:
    with anyio.fail_after(90):
        await run(shared_client, "a = 1\nprint('in a')", session="alpha")
        await run(shared_client, "b = 2", session="beta")
        listed = json.loads(text_of(await shared_client.call_tool("list_sessions", {})))
        names = {s["session"]: s for s in listed["sessions"]}
        assert set(names) == {"alpha", "beta"}
        alpha_container = names["alpha"]["container"]
        assert alpha_container in kb.containers()

        # The notebook itself comes from the resource; export_notebook says where it is.
        resource = await shared_client.read_resource("kernelbridge://sessions/alpha/notebook")
        nb = nbformat.reads(resource.contents[0].text, as_version=4)
        nbformat.validate(nb)
        assert nb.cells[0].source == "a = 1\nprint('in a')"
        assert nb.cells[0].metadata.kernelbridge["status"] == "ok"
        assert nb.metadata.kernelspec.name == "kernelbridge"
        exported = await shared_client.call_tool("export_notebook", {"session": "alpha"})
        assert exported.is_error is False and exported.structured_content == {
            "session": "alpha",
            "cells": 1,
            "bytes": len(resource.contents[0].text.encode()),
            "resource": "kernelbridge://sessions/alpha/notebook",
            "resource_too_big": False,
            "file": None,
        }
        written = await shared_client.call_tool(
            "export_notebook", {"session": "alpha", "path": "alpha.ipynb"}
        )
        file = shared_bridge.state_dir / "exports" / "alpha.ipynb"
        assert written.is_error is False and written.structured_content["file"] == str(file)
        on_disk = nbformat.read(file, as_version=4)  # the same notebook (cell ids are made per export)
        assert [c.source for c in on_disk.cells] == [c.source for c in nb.cells]
        assert (
            file.stat().st_size == written.structured_content["bytes"] == exported.structured_content["bytes"]
        )
        refused = await shared_client.call_tool("export_notebook", {"session": "alpha", "path": "/tmp/x.sh"})
        assert refused.is_error is True and ".ipynb" in text_of(refused)

        manual = await shared_client.read_resource("kernelbridge://capabilities")
        assert "run_python" in manual.contents[0].text

        closed = await shared_client.call_tool("close_session", {"session": "alpha"})
        assert closed.is_error is False
        assert alpha_container not in kb.containers()
        listed = json.loads(text_of(await shared_client.call_tool("list_sessions", {})))
        assert [s["session"] for s in listed["sessions"]] == ["beta"]
        fresh = await run(shared_client, "'a' in globals()", session="alpha")
        assert fresh.structured_content["result"] == "False"


NOISE_IMAGE = """
import io
import numpy as np
from PIL import Image
from IPython.display import Image as Shown, display
png = io.BytesIO()
Image.fromarray(np.random.default_rng(0).integers(0, 255, (600, 600, 3), dtype=np.uint8)).save(png, "PNG")
display(Shown(png.getvalue()))
"""


async def test_an_export_keeps_the_notebook_out_of_the_models_context(shared_client: Client) -> None:
    with anyio.fail_after(120):
        shown = await run(shared_client, NOISE_IMAGE, session="pics")
        assert shown.is_error is False, text_of(shown)
        exported = await shared_client.call_tool("export_notebook", {"session": "pics"})
        resource = await shared_client.read_resource("kernelbridge://sessions/pics/notebook")
    notebook = resource.contents[0].text
    assert len(notebook) > 1_000_000  # the image, base64, inline in the notebook
    # The answer: a few lines that say what the notebook holds and where it is; not the notebook.
    assert exported.is_error is False and [block.type for block in exported.content] == ["text"]
    assert len(text_of(exported)) < 600, len(text_of(exported))
    assert "kernelbridge://sessions/pics/notebook" in text_of(exported)
    summary = exported.structured_content
    assert summary["cells"] == 1 and summary["bytes"] == len(notebook.encode()) and summary["file"] is None
    assert nbformat.reads(notebook, as_version=4).cells[0].outputs[0]["data"]["image/png"]


async def test_disconnecting_lets_every_sandbox_run_on_until_it_is_closed(
    connect: Any, kb: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with anyio.fail_after(120):
        async with connect(state) as client:
            await run(client, "1", session="one")
            await run(client, "1", session="two")
            listed = json.loads(text_of(await client.call_tool("list_sessions", {})))
            ours = [s["container"] for s in listed["sessions"]]
            assert all(name in kb.containers() for name in ours)
        # The client went: its sessions run on, detached, for the next bridge (the default).
        assert set(ours) <= set(kb.containers())
        env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state)}
        shown = await anyio.run_process([str(KERNELBRIDGE), "sessions", "--json"], env=env)
        assert {r["name"]: r["state"] for r in json.loads(shown.stdout)} == {
            "one": "detached",
            "two": "detached",
        }
        for name in ("one", "two"):
            await anyio.run_process([str(KERNELBRIDGE), "sessions", "close", name], env=env)
    assert not set(ours) & set(kb.containers())


async def test_disconnecting_removes_every_container_when_sessions_end_with_their_bridge(
    connect: Any, kb: Any
) -> None:
    # KERNELBRIDGE_DURABLE=0 is what this test is about.
    with anyio.fail_after(90):
        async with connect(KERNELBRIDGE_DURABLE="0") as client:
            await run(client, "1", session="one")
            await run(client, "1", session="two")
            listed = json.loads(text_of(await client.call_tool("list_sessions", {})))
            ours = [s["container"] for s in listed["sessions"]]
            assert all(name in kb.containers() for name in ours)
        remaining = set(kb.containers())
    assert not remaining & set(ours)
