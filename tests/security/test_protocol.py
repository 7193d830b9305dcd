"""Protocol attacks on the host end of the tunnel, fed over a real local stream (a socketpair):
the test plays the sandbox and writes what a hostile one could, frame by frame and byte by byte.
The tunnel must drop and count what it cannot use, never end, never block, never tell its owner
anything it was not asked for, keep its logs small and its memory bounded, and keep relaying."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream
from bridge_harness import reset_peak, status_kib

from kernelbridge import frames
from kernelbridge.tunnel import ControlChannel, ControlMessage, Tunnel, TunnelState, memory_channel_pair

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Hostile:
    """The sandbox's end of a tunnel: write lines, see what the owner and the peer received."""

    sandbox: SocketStream
    tunnel: Tunnel
    owner: ControlChannel
    events: list[ControlMessage] = field(default_factory=list)
    iopub: list[dict[str, Any]] = field(default_factory=list)
    hello: frames.Frame | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)

    def note(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, done: Any) -> None:
        """Wait (bounded) until ``done()`` holds; woken by every event and message."""
        with anyio.fail_after(60):
            while not done():
                await self.changed.wait()

    async def write(self, data: bytes) -> None:
        with anyio.fail_after(60):
            await self.sandbox.send(data)

    async def frame(self, frame: frames.Frame) -> None:
        await self.write(frames.encode(frame))

    async def settle(self) -> None:
        """Wait until the tunnel consumed everything written: a marker comes back to the peer."""
        marker = {"header": {"msg_id": "m", "msg_type": "stream"}, "parent_header": {}, "content": {"x": 1}}
        count = len(self.iopub)
        await self.frame(frames.kernel_frame("iopub", marker))
        await self.until(lambda: len(self.iopub) > count)


@asynccontextmanager
async def hostile_tunnel(tmp_path: Path) -> AsyncIterator[Hostile]:
    host_sock, sandbox_sock = socket.socketpair()
    host = await SocketStream.from_socket(host_sock)
    sandbox = await SocketStream.from_socket(sandbox_sock)
    owner, tunnel_end = memory_channel_pair()
    hostile: Hostile | None = None

    async def peer(channel: str, msg: dict[str, Any], buffers: list[bytes]) -> None:
        assert hostile is not None
        if channel == "iopub":
            hostile.iopub.append(msg)
            hostile.note()

    tunnel = Tunnel(host, tunnel_end, connection=None, session="hostile", kernel_key="k", peer=peer)
    hostile = Hostile(sandbox, tunnel, owner)

    async def drain_owner() -> None:
        async for frame in _frames(owner):
            hostile.events.append(frame)
            hostile.note()

    async with anyio.create_task_group() as tg:
        await tg.start(tunnel.run)
        tg.start_soon(drain_owner)
        decoder = frames.FrameDecoder()
        with anyio.fail_after(30):
            while hostile.hello is None:
                for item in decoder.feed(await sandbox.receive()):
                    hostile.hello = item if isinstance(item, dict) else None
        await hostile.frame({"type": frames.READY, "versions": {"python": "3"}, "agent_hash": "x"})
        await hostile.until(lambda: bool(hostile.events))
        assert hostile.events[0].TYPE == frames.READY
        yield hostile
        tg.cancel_scope.cancel()
    await sandbox.aclose()


async def _frames(channel: ControlChannel) -> AsyncIterator[ControlMessage]:
    while True:
        try:
            yield await channel.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return


def msg(
    msg_type: str = "stream", parent: Any = None, content: Any = None, header: Any = None
) -> dict[str, Any]:
    return {
        "header": {"msg_id": "h", "msg_type": msg_type} if header is None else header,
        "parent_header": parent if parent is not None else {},
        "content": content if content is not None else {},
    }


FORGED: list[frames.Frame] = [
    # host-bound types the sandbox has no business sending
    {"type": frames.HELLO, "key": "stolen"},
    {"type": frames.LAUNCH, "connection_file": "/etc/passwd"},
    {"type": frames.INTERRUPT},
    {"type": frames.RESTART},
    {"type": frames.SHUTDOWN},
    {"type": frames.RPC_RESPONSE, "id": 1, "result": {}},
    {"type": frames.FS_REQUEST, "id": 1, "op": "read", "path": "x"},
    # sandbox types with wrong fields
    {"type": frames.READY, "versions": "not a dict"},
    {"type": frames.EXIT, "status": "x", "kind": "evil", "reason": ["a"]},
    {"type": frames.LOG, "level": {"a": 1}, "message": None},
    {"type": frames.RPC_REQUEST, "id": "x", "method": 5},
    {"type": frames.FS_RESPONSE, "id": None},
    # kernel frames of every channel, broken in every part
    {"type": frames.KERNEL, "channel": "iopub", "msg": msg(content={"data": [1, 2], "metadata": "x"})},
    {"type": frames.KERNEL, "channel": "iopub", "msg": msg("display_data", content={"data": {"a": [1]}})},
    {"type": frames.KERNEL, "channel": "iopub", "msg": msg("status", parent={"msg_type": "execute_request"})},
    {"type": frames.KERNEL, "channel": "iopub", "msg": msg("error", content={"traceback": "x", "ename": 1})},
    {"type": frames.KERNEL, "channel": "shell", "msg": msg("execute_reply", parent={"msg_id": 5})},
    {"type": frames.KERNEL, "channel": "shell", "msg": msg("execute_reply", parent={"msg_id": "unknown"})},
    {"type": frames.KERNEL, "channel": "stdin", "msg": msg("input_request", parent="x")},
    {"type": frames.KERNEL, "channel": "control", "msg": msg(header={})},
    {"type": frames.KERNEL, "channel": "hb", "msg": msg()},
    {"type": frames.KERNEL, "channel": "iopub", "msg": msg(), "buffers": ["not base64!"]},
    {"type": frames.KERNEL, "channel": "iopub", "msg": msg(), "buffers": "x"},
]


async def test_forged_frames_of_every_type(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kernelbridge.tunnel")
    async with hostile_tunnel(tmp_path) as h:
        for frame in FORGED:
            await h.frame(frame)
        await h.settle()
        assert h.tunnel.state is TunnelState.READY
        # The owner heard the rpc_request and fs_response (its business to check), nothing else.
        assert {e.TYPE for e in h.events[1:]} <= {frames.RPC_REQUEST, frames.FS_RESPONSE}
        assert h.tunnel.dropped >= 9
        exit_frame = {"type": frames.EXIT, "status": -9, "kind": "oom", "reason": "r" * (10 * MiB)}
        await h.frame(exit_frame)
        await h.settle()
        assert h.tunnel.exited is not None and len(h.tunnel.exited.reason) < 600
    assert len(caplog.text) < 100_000


async def test_thousands_of_ready_frames_neither_reach_the_owner_nor_block(tmp_path: Path) -> None:
    async with hostile_tunnel(tmp_path) as h:
        ready = frames.encode({"type": frames.READY, "versions": {"v": "x" * 1000}})
        with anyio.fail_after(30):
            await h.write(ready * 3000)
            await h.settle()
        assert [e.TYPE for e in h.events] == [frames.READY]
        assert h.tunnel.dropped == 3000


async def test_a_log_flood_is_rate_limited_and_clipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kernelbridge.tunnel")
    async with hostile_tunnel(tmp_path) as h:
        line = frames.encode({"type": frames.LOG, "level": "x" * 1000, "message": "m" * MiB})
        for _ in range(300):
            await h.write(line)
        await h.settle()
    # 300 MiB of log frames become at most LOG_BURST clipped lines.
    assert len(caplog.text) < 1_000_000
    assert "m" * 3000 not in caplog.text


BAD_LINES = [
    b"\x00\xff\xfe not json",
    b"\xc3\x28 invalid utf-8",
    b'{"type": "log", "message": "\xed\xa0\x80"}',  # an encoded surrogate: invalid UTF-8
    b'{"type": "log", "message": "\\ud800 lone surrogate escape"}',  # valid JSON: a log line
    b"[1, 2, 3]",
    b'"a string"',
    b"{}",
    b'{"type": null}',
    b'{"type": "log", "message": NaN, "x": Infinity}',
    b'{"type": "log", "message": ' + b"9" * 50_000 + b"}",  # past int_max_str_digits
    b'{"type": "log", "a": 1, "a": 2}',
    b"{" * 100_000,
    b'{"type":"log","message":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"type":"log","message":[' + b"[]," * 1_400_000 + b"0]}",  # 1.4 million values in 4 MiB
    b"   ",
]


async def test_oversized_deep_and_invalid_lines(tmp_path: Path) -> None:
    async with hostile_tunnel(tmp_path) as h:
        for line in BAD_LINES:
            await h.write(line + b"\n")
        # A 49 MiB line (over the 48 MiB cap), written in odd chunks: discarded as it streams in.
        pid = __import__("os").getpid()
        before = status_kib(pid, "VmRSS")
        reset_peak(pid)
        chunk = b'{"type":"log","message":"' + b"x" * (7 * MiB + 13)
        for _ in range(7):
            await h.write(chunk)
        await h.write(b'"}\n')
        await h.settle()
        peak = status_kib(pid, "VmHWM") - before
        assert h.tunnel.state is TunnelState.READY
        assert h.tunnel.dropped >= len(BAD_LINES) - 3  # the surrogate, duplicate key and NaN lines parse
        assert h.tunnel.decoder.pending_bytes == 0
        assert peak < 160 * 1024, peak  # KiB: never the whole line, never a parse of it
        # Still relaying: a valid message after all that arrives.
        await h.frame(frames.kernel_frame("iopub", msg(content={"text": "after"})))
        await h.settle()
        assert any(m["content"].get("text") == "after" for m in h.iopub)


async def test_a_byte_at_a_time(tmp_path: Path) -> None:
    async with hostile_tunnel(tmp_path) as h:
        data = frames.encode(frames.kernel_frame("iopub", msg(content={"text": "slow"}))) + b"garbage\n"
        for byte in data:
            await h.write(bytes([byte]))
        await h.settle()
        assert any(m["content"].get("text") == "slow" for m in h.iopub)
        assert h.tunnel.dropped == 1


def test_the_decoder_never_holds_more_than_its_cap() -> None:
    decoder = frames.FrameDecoder(max_frame_bytes=1000)
    results = []
    for _ in range(100):
        results += decoder.feed(b"y" * 999)
        assert decoder.pending_bytes <= 100_000
    results += decoder.feed(b"\n")
    assert len(results) == 1 and isinstance(results[0], frames.FrameError)
    assert json.loads(frames.encode({"type": "log", "message": "ok"})) == {"type": "log", "message": "ok"}
