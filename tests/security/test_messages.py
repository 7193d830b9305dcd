"""Kernel messages with parts missing (a header without msg_id, an empty parent) from kernel code
and from an attached Jupyter client: dropped or ignored, never a reason to discard a live sandbox."""

from __future__ import annotations

import pytest
from bridge_harness import Bridge
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
