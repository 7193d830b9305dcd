"""The tunnel's host-side iopub (an XPUB): nothing is serialized for nobody, each subscription is
greeted with JEP 65's ``iopub_welcome`` (signed with the connection's key) before anything else
(as ipykernel does, a welcome on the topic ``""`` reaches every subscriber), and a subscriber gets
what is published after its welcome. Real ZMQ sockets on loopback."""

from __future__ import annotations

import anyio
import pytest
import zmq
import zmq.asyncio

from kernelbridge import frames
from kernelbridge.tunnel.sockets import ClientSockets

pytestmark = pytest.mark.anyio

KEY = b"a-test-key"
BOUND = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def stream_message(text: str) -> dict[str, object]:
    header = {"msg_id": text, "msg_type": "stream", "session": "s", "username": "u", "version": "5.3"}
    content = {"name": "stdout", "text": text}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content}


async def received(sub: zmq.asyncio.Socket) -> frames.WireMessage:
    with anyio.fail_after(BOUND):
        wire = frames.from_wire(await sub.recv_multipart())
    assert frames.verify(KEY, wire)
    return wire


async def test_iopub_is_published_only_to_subscribers_and_each_is_welcomed_first() -> None:
    sockets = ClientSockets({"ip": "127.0.0.1"}, KEY)
    sockets.bind()
    subscribers: list[zmq.asyncio.Socket] = []
    try:
        async with anyio.create_task_group() as tg:

            async def ignore(channel: str, message: frames.WireMessage) -> None:
                pass

            tg.start_soon(sockets.serve, ignore)
            assert not sockets.subscribed
            await sockets.publish(stream_message("for nobody"), [])
            for _ in range(2):  # a second client on the same topic is greeted too (XPUB_VERBOSE)
                sub = sockets.ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.connect(f"tcp://127.0.0.1:{sockets.connection['iopub_port']}")
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                subscribers.append(sub)
                welcome = await received(sub)
                assert welcome.msg["header"]["msg_type"] == "iopub_welcome"
                assert welcome.msg["content"] == {"subscription": ""}
            await sockets.publish(stream_message("for both"), [])
            for sub in subscribers:
                got = await received(sub)
                while got.msg["header"]["msg_type"] == "iopub_welcome":  # the first hears the second's
                    got = await received(sub)
                assert got.msg["content"]["text"] == "for both"  # "for nobody" never came
            tg.cancel_scope.cancel()
    finally:
        for sub in subscribers:
            sub.close(linger=0)
        sockets.close()
