"""The tunnel of a durable sandbox behind a runtime that relays both directions of its stdio in one
loop (podman's conmon does): while the host has not taken the sandbox's stdout, none of the host's
stdin is taken either. So the host must read stdout whatever its writes to stdin are doing.

The bug this guards: the reader of the sandbox's stdout sent the durable link's ``ack`` itself,
under the lock of stdin writes. A burst of host calls (10,000 of them, each answered or refused
``busy``) had a batch of answers waiting for stdin while stdout filled up; the reader waited for
the lock, so stdout was never read again, the runtime took no more stdin, and after 30 s the
tunnel gave stdin up: the cell never returned (tests/security/test_host_mcp_attacks.py, burst).
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import ByteStream

from kernelbridge import frames
from kernelbridge.host.commands import CommandQueue
from kernelbridge.tunnel import Durability, RpcRequest, RpcResponse, memory_channel_pair
from kernelbridge.tunnel.core import Tunnel

pytestmark = pytest.mark.anyio

BOUND = 10.0
"""Far more than the few hundred milliseconds this takes; a deadlock waits for ever (30 s before
the tunnel gives stdin up)."""
CAPACITY = 64 * 1024
"""Bytes of the sandbox's stdout the runtime holds (a pipe's worth)."""
STEP = 4096
"""Bytes of stdin the runtime takes per turn of its loop."""
CALLS = 3000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class OneLoopRelay(ByteStream):
    """The host's end of a sandbox's stdio through a runtime with one loop for both directions:
    stdin is taken only while the sandbox's stdout buffer has room (the loop is not blocked
    writing stdout to the host). The sandbox's end is :meth:`write_stdout` / :meth:`read_stdin`."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stdin = bytearray()
        self.stdout_closed = False
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()

    # -- the host's end ---------------------------------------------------------------------------
    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self.stdout:
            if self.stdout_closed:
                raise anyio.EndOfStream
            await self._wait()
        data = bytes(self.stdout[:max_bytes])
        del self.stdout[:max_bytes]
        self._notify()
        return data

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            while len(self.stdout) >= CAPACITY:  # the loop is blocked on stdout: no stdin moves
                await self._wait()
            self.stdin += view[:STEP]
            view = view[STEP:]
            self._notify()
            await anyio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    # -- the sandbox's end ------------------------------------------------------------------------
    async def write_stdout(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            while len(self.stdout) >= CAPACITY:
                await self._wait()
            room = CAPACITY - len(self.stdout)
            self.stdout += view[:room]
            view = view[room:]
            self._notify()

    async def read_stdin(self) -> bytes:
        while not self.stdin:
            await self._wait()
        data = bytes(self.stdin)
        self.stdin.clear()
        self._notify()
        return data


async def test_a_burst_of_calls_is_answered_while_stdout_and_stdin_are_both_full() -> None:
    relay = OneLoopRelay()
    owner_end, tunnel_end = memory_channel_pair()
    tunnel = Tunnel(
        relay,
        tunnel_end,
        connection=None,
        session="burst",
        kernel_key="k",
        durability=Durability("5e" * 32, 60.0, 1 << 20),
    )
    commands = CommandQueue("burst")  # the owner's queue: its event pump never waits for stdin
    answered: set[int] = set()
    acks = 0
    all_answered = anyio.Event()

    async def owner() -> None:
        while True:
            event = await owner_end.receive()
            if isinstance(event, RpcRequest):
                refusal = {"kind": "busy", "message": "too many host calls in flight " + "." * 200}
                commands.put(RpcResponse(event.id, None, refusal))

    async def sandbox_writes() -> None:
        for request_id in range(1, CALLS + 1):
            request = {"type": frames.RPC_REQUEST, "id": request_id, "method": "call_tool", "params": {}}
            await relay.write_stdout(frames.encode(request))

    async def sandbox_reads() -> None:
        nonlocal acks
        decoder = frames.FrameDecoder()
        while len(answered) < CALLS:
            for frame in decoder.feed(await relay.read_stdin()):
                assert not isinstance(frame, frames.FrameError), frame
                if frame["type"] == frames.RPC_RESPONSE:
                    answered.add(frame["id"])
                elif frame["type"] == frames.ACK:
                    acks += 1
        all_answered.set()

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sandbox_reads)
            await tg.start(tunnel.run)
            tg.start_soon(commands.pump, owner_end)
            tg.start_soon(owner)
            tg.start_soon(sandbox_writes)
            await all_answered.wait()
            tg.cancel_scope.cancel()
    assert answered == set(range(1, CALLS + 1))
    assert acks > 0  # the durable link was acknowledged along the way
    assert commands.dropped == 0
