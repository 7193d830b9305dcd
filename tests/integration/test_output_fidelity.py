"""A session's notebook, output for output, against what nbclient makes of the same cells on a local
kernel (ipykernel of this venv, no container): Jupyter's output rules, across cells.

Real parts only: ``kernelbridge serve`` over stdio with the MCP SDK's client, a real sandbox, a
second real Jupyter client on the session's connection file (as ``kernelbridge attach`` connects),
and nbclient with the venv's ``python3`` kernel as the reference. nbclient keeps one stream output
per message (so its outputs depend on when the kernel flushes); the notebook front ends and
nbconvert merge consecutive ones, and the reference goes through nbconvert's own
``CoalesceStreamsPreprocessor`` for that, nothing else. The sandbox's IPython and ipykernel are the
venv's versions (checked first), so tracebacks compare too.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from bridge_harness import notebook_of
from jupyter_client.asynchronous.client import AsyncKernelClient
from local_kernel import local_notebook_client
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

from kernelbridge.session.store import list_session_records

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

CELLS = [
    "from IPython.display import HTML, clear_output, display, update_display",
    # nbclient's tests/files/Clear Output.ipynb, cell by cell
    "for i in range(10):\n    clear_output()\n    print(i)",
    'print("Hello world")\nclear_output()',
    'print("Hello world", end="")\nclear_output(wait=True)  # no output after this',
    'print("Hello", end="")\nclear_output(wait=True)  # here we have new output after wait=True\n'
    'print("world", end="")',
    'handle0 = display("Hello world", display_id="id0")',
    'handle1 = display("Hello", display_id="id1")',
    'handle1.update("world")',
    'handle2 = display("Hello world", display_id="id2")\n'
    "clear_output()  # clears all output, also with display_ids",
    'handle3 = display("Hello world", display_id="id3")\nclear_output(wait=True)',
    'handle4 = display("Hello", display_id="id4")\nclear_output(wait=True)\nprint("world", end="")',
    'handle4.update("Hello world")  # it is cleared, so it should not show up in the above cell',
    # a progress bar, streams interleaved, a result after a display
    'for n in range(0, 101, 25):\n    print(f"\\r{n:3d}%", end="", flush=True)\nprint(" done")',
    'import sys\nprint("out", flush=True)\nprint("err", file=sys.stderr, flush=True)\nprint("out again")',
    'display(HTML("<b>bold</b>"), metadata={"isolated": True})\n40 + 2',
    # a display id shown again in a later cell, and updated from another: every cell shows the last
    'shared = display("v1", display_id="shared")',
    'display("v2", display_id="shared")\nprint("and more")',
    'update_display("v3", display_id="shared")\nupdate_display("nobody", display_id="never-shown")',
    "1 / 0",
    'print("after the error")',
]


def reference(cells: list[str], where: Path) -> list[list[dict[str, Any]]]:
    """What nbclient saves for ``cells`` on the venv's own kernel, streams coalesced by nbconvert."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in cells])
    client = local_notebook_client(nb, where, timeout=60, allow_errors=True)
    client.execute()
    coalesce = CoalesceStreamsPreprocessor()
    for index, cell in enumerate(nb.cells):
        coalesce.preprocess_cell(cell, {}, index)
    return [_plain(cell.outputs) for cell in nb.cells]


def _plain(outputs: Any) -> list[dict[str, Any]]:
    return [dict(copy.deepcopy(o)) for o in outputs]


def _versions() -> str:
    import ipykernel
    import IPython

    return f"{ipykernel.__version__} {IPython.__version__}"


async def _outputs_of(client: Any, session: str) -> list[list[dict[str, Any]]]:
    nb = nbformat.reads(await notebook_of(client, session), as_version=4)
    nbformat.validate(nb)
    return [_plain(cell.outputs) for cell in nb.cells]


async def _run_as_client(connection_file: str, cells: list[str]) -> None:
    kc = AsyncKernelClient()
    kc.load_connection_file(connection_file)
    kc.session.username = "person"
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        for code in cells:
            msg_id = kc.execute(code)
            while (await kc.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
                pass
            while True:  # its last output is on iopub before its idle
                msg = await kc.get_iopub_msg(timeout=60)
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
                    if msg["content"]["execution_state"] == "idle":
                        break
    finally:
        kc.stop_channels()


def assert_same(
    expected: list[list[dict[str, Any]]], got: list[list[dict[str, Any]]], cells: list[str]
) -> None:
    assert len(got) == len(expected)
    for code, was, now in zip(cells, expected, got, strict=True):
        assert now == was, f"cell {code!r}:\n nbclient: {was}\n session:  {now}"


async def test_a_sessions_notebook_is_what_nbclient_saves_for_the_same_cells(
    connect: Any, tmp_path: Path
) -> None:
    cells = ["pass", *CELLS]
    expected = await anyio.to_thread.run_sync(reference, cells, tmp_path)
    state = tmp_path / "state"
    with anyio.fail_after(300):
        async with connect(state) as client:
            versions = await client.call_tool(
                "run_python",
                {"code": "import IPython, ipykernel\nprint(ipykernel.__version__, IPython.__version__)"},
            )
            inside = versions.structured_content["stdout"].strip()
            if inside != _versions():
                pytest.skip(f"the sandbox runs ipykernel and IPython {inside}, this venv {_versions()}")
            await client.call_tool("close_session", {"session": "default"})
            # The bridge's own cells, one run_python call each.
            results = [
                await client.call_tool("run_python", {"code": code, "session": "mcp"}) for code in cells
            ]
            assert_same(expected, await _outputs_of(client, "mcp"), cells)
            # What the model read of its own cells follows the same rules.
            said = [r.structured_content for r in results]
            assert said[cells.index(CELLS[3])]["stdout"] == "Hello world"
            assert said[cells.index(CELLS[4])]["stdout"] == "world"
            assert said[cells.index(CELLS[12])]["stdout"] == "100% done\n"
            assert said[cells.index(CELLS[2])]["stdout"] == ""

            # The same cells typed by a person in an attached client: journalled the same.
            await client.call_tool("run_python", {"code": "pass", "session": "attached"})
            (record,) = [r for r in list_session_records(state) if r["name"] == "attached"]
            await _run_as_client(record["connection_file"], CELLS)
            assert_same(expected, await _outputs_of(client, "attached"), cells)
