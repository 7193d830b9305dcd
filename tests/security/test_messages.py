"""Kernel messages with parts missing (a header without msg_id, an empty parent) from kernel code
and from an attached Jupyter client: dropped or ignored, never a reason to discard a live sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import nbformat
import pytest
from bridge_harness import KERNELBRIDGE, Bridge
from jupyter_client.blocking.client import BlockingKernelClient

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

FROM_KERNEL = r"""
k = get_ipython().kernel
for parent in ({}, {"msg_type": "execute_request"}, {"msg_id": None}, {"msg_id": ["x"]}):
    msg = k.session.msg("stream", {"name": "stdout", "text": "odd\n"}, parent=k.get_parent())
    del msg["header"]["msg_id"]
    msg["parent_header"] = parent
    k.session.send(k.iopub_socket, msg, ident=b"kernel.stream")
    status = k.session.msg("status", {"execution_state": "busy"})
    status["header"].pop("msg_id")
    status["parent_header"] = parent
    k.session.send(k.iopub_socket, status, ident=b"kernel.status")
print("sent")
"""


async def test_headers_without_msg_id_do_not_discard_the_sandbox(bridge: Bridge) -> None:
    session = "msg-no-id"
    await bridge.run("kept = 7", session)
    container = await bridge.container(session)
    assert (await bridge.run(FROM_KERNEL, session)).status == "ok"
    # An attached client sends requests without msg_id too.
    client = BlockingKernelClient()
    client.load_connection_info(bridge.connection(session))
    client.start_channels()
    try:
        odd = client.session.msg("execute_request", {"code": "1", "silent": False})
        del odd["header"]["msg_id"]
        client.session.send(client.shell_channel.socket, odd)
        client.execute("from_client = 1")
        client.get_shell_msg(timeout=30)
    finally:
        client.stop_channels()
    after = await bridge.run("kept", session)
    assert after.status == "ok" and after.data["result"] == "7", after.text
    assert await bridge.container(session) == container


DEEP_DISPLAY = r"""
from IPython.display import display
metadata = current = {}
for _ in range(900):
    current["a"] = {}
    current = current["a"]
display({"text/plain": "deep"}, raw=True, metadata=metadata)
print("done")
"""


async def test_a_display_nested_900_deep_leaves_the_notebook_exportable(
    bridge: Bridge, tmp_path: Path
) -> None:
    session = "msg-deep"
    result = await bridge.run(DEEP_DISPLAY, session)
    assert result.status == "ok" and result.stdout == "done\n", result.text
    failed, text = await bridge.call("export_notebook", session=session)
    assert not failed, text
    nbformat.validate(nbformat.reads(await bridge.notebook(session), as_version=4))
    out = tmp_path / "deep.ipynb"
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(bridge.state_dir)}
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [str(KERNELBRIDGE), "export", session, "-o", str(out)], env=env, check=False
        )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    nbformat.validate(nbformat.read(str(out), as_version=4))
