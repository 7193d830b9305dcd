"""The tunnel over a real stdio stream, with the agent run locally by the test-double runtime (no
container): hostile bytes from the sandbox side are dropped, routing keeps each client's replies
its own, the owner's control frames interrupt and restart the kernel behind the same sockets."""

from __future__ import annotations

import json
import logging
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from jupyter_client.asynchronous import AsyncKernelClient

from kernelbridge import frames
from kernelbridge.host.connection import new_connection, write_connection_file
from kernelbridge.runtime import ContainerSpec
from kernelbridge.testing import LocalProcessRuntime
from kernelbridge.tunnel import ControlChannel, Event, Interrupt, Ready, Restart, Tunnel, memory_channel_pair

# Before exec'ing the agent, the fake "container" writes what a hostile sandbox could: garbage,
# JSON that is not an object, an unknown frame type, a reply nobody asked for, a 3 MiB line, a
# line nested 100 000 levels deep, a ready frame nobody asked for later.
HOSTILE_PREFIX = r"""
import os, sys
out = sys.stdout.buffer
out.write(b"\x00\xffnot json\n[1, 2]\n\"str\"\n{\"type\": \"nope\"}\n")
out.write(b'{"type": "kernel", "channel": "shell", "msg": {"header": {}, "parent_header": {}}}\n')
out.write(b'{"type": "log", "message": "' + b"y" * (3 * 1024 * 1024) + b'"}\n')
out.write(b'{"type": "log", "message": ' + b"[" * 100000 + b"]" * 100000 + b"}\n")
out.flush()
os.execv(sys.executable, [sys.executable, "-m", "kernelbridge.inside.agent"])
"""


@dataclass
class Running:
    tunnel: Tunnel
    owner: ControlChannel
    connection_file: str

    async def event(self, kind: type[Event]) -> Event:
        with anyio.fail_after(30):
            while not isinstance(event := await self.owner.receive(), kind):
                pass
        return event


@asynccontextmanager
async def running_tunnel(tmp_path: Path, command: tuple[str, ...] = ()) -> AsyncIterator[Running]:
    """A tunnel on a locally run agent, ready (the owner got ``ready``), torn down at the end."""
    spec = ContainerSpec(image="none", name="t", session="t", owner_pid=0, command=command)
    async with LocalProcessRuntime() as runtime:
        stream = await runtime.attach(await runtime.create(spec))
        owner, tunnel_end = memory_channel_pair()
        tunnel = Tunnel(
            stream, tunnel_end, connection=new_connection(), session="t", kernel_key=secrets.token_hex(8)
        )
        async with anyio.create_task_group() as tg:
            await tg.start(tunnel.run)
            assert tunnel.connection is not None
            path = tmp_path / "kernel.json"
            write_connection_file(path, tunnel.connection)
            running = Running(tunnel, owner, str(path))
            await running.event(Ready)
            yield running
            tg.cancel_scope.cancel()


@asynccontextmanager
async def connected(connection_file: str) -> AsyncIterator[AsyncKernelClient]:
    """A client on the tunnel's sockets, ready (shell answered), stopped at the end."""
    kc = AsyncKernelClient(connection_file=connection_file)
    kc.load_connection_file()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=30)
        yield kc
    finally:
        kc.stop_channels()


async def execute(kc: AsyncKernelClient, code: str) -> dict:
    msg_id = kc.execute(code)
    with anyio.fail_after(30):
        while True:
            reply = await kc.get_shell_msg(timeout=30)
            if reply["parent_header"]["msg_id"] == msg_id:
                return reply


@pytest.mark.anyio
async def test_hostile_frames_are_logged_and_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kernelbridge.tunnel")
    command = (sys.executable, "-c", HOSTILE_PREFIX)
    async with running_tunnel(tmp_path, command) as running, connected(running.connection_file) as kc:
        reply = await execute(kc, "40 + 2")
        assert reply["content"]["status"] == "ok"
        assert running.tunnel.dropped >= 5
    log = caplog.text
    for reason in ("not JSON", "not a JSON object", "unknown frame type", "nested too deeply"):
        assert reason in log
    assert "y" * 3000 not in log  # strings from the sandbox are clipped before they are logged


@pytest.mark.anyio
async def test_replies_go_to_the_client_that_asked(tmp_path: Path) -> None:
    async with (
        running_tunnel(tmp_path) as running,
        connected(running.connection_file) as first,
        connected(running.connection_file) as second,
    ):
        ids = {first.execute("import time; time.sleep(0.2); 'first'"), second.execute("'second'")}
        got_first = await first.get_shell_msg(timeout=30)
        got_second = await second.get_shell_msg(timeout=30)
        assert got_first["parent_header"]["msg_id"] in ids
        assert got_second["parent_header"]["msg_id"] in ids
        assert got_first["parent_header"]["msg_id"] != got_second["parent_header"]["msg_id"]
        assert got_first["parent_header"]["session"] == first.session.session
        assert got_second["parent_header"]["session"] == second.session.session


@pytest.mark.anyio
async def test_an_interrupt_frame_from_the_owner_interrupts_the_kernel(tmp_path: Path) -> None:
    async with running_tunnel(tmp_path) as running, connected(running.connection_file) as kc:
        msg_id = kc.execute("import time\nprint('started', flush=True)\nfor _ in range(600): time.sleep(0.1)")
        # Wait for output from the cell itself: ipykernel publishes execute_input before the cell
        # runs, and a SIGINT landing in between is swallowed by its event loop (and the cell lost).
        with anyio.fail_after(10):
            while (await kc.get_iopub_msg(timeout=10))["content"].get("text") != "started\n":
                pass
        await running.owner.send(Interrupt())
        reply = await kc.get_shell_msg(timeout=10)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["ename"] == "KeyboardInterrupt"


def test_frames_module_is_stdlib_only() -> None:
    # The agent imports it inside the sandbox image, where only the stdlib and pyzmq exist.
    source = Path(frames.__file__).read_text()
    imports = {
        line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
    }
    stdlib = {"__future__", "base64", "hashlib", "hmac", "json", "collections", "dataclasses", "typing"}
    assert imports <= stdlib


@pytest.mark.anyio
async def test_malformed_client_messages_do_not_break_the_tunnel(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import zmq
    import zmq.asyncio

    caplog.set_level(logging.INFO, "kernelbridge.tunnel")
    async with running_tunnel(tmp_path) as running:
        info = json.loads(await anyio.Path(running.connection_file).read_text())
        ctx = zmq.asyncio.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.connect(f"tcp://127.0.0.1:{info['shell_port']}")
        for parts in (
            [b"<IDS|MSG>"],
            [b"no delimiter"],
            [b"<IDS|MSG>", b"sig", b"{}"],
            [b"<IDS|MSG>", *[b"x"] * 5],
            [b"<IDS|MSG>", b"forged", *[b"{}"] * 4],
        ):
            await raw.send_multipart(parts)
        raw.close(linger=2000)  # deliver what was sent before closing
        ctx.term()
        async with connected(running.connection_file) as kc:
            assert (await execute(kc, "'alive'"))["content"]["status"] == "ok"
    assert "dropped a malformed shell message" in caplog.text
    assert "dropped a shell message with a bad signature" in caplog.text


@pytest.mark.anyio
async def test_a_restart_frame_replaces_the_kernel_behind_the_same_sockets(tmp_path: Path) -> None:
    async with running_tunnel(tmp_path) as running, connected(running.connection_file) as kc:
        await execute(kc, "before_restart = 1")
        await running.owner.send(Restart())
        await running.event(Ready)
        reply = await execute(kc, "before_restart")  # the same client, no reconnect
        assert reply["content"]["ename"] == "NameError"


@pytest.mark.anyio
async def test_a_ready_frame_nobody_asked_for_is_dropped(tmp_path: Path) -> None:
    async with running_tunnel(tmp_path) as running:
        await running.tunnel.handle({"type": frames.READY, "versions": {}})
        assert running.tunnel.dropped == 1
        # Nothing reached the owner: the next event it sees is the one it asks for.
        await running.owner.send(Restart())
        assert isinstance(await running.event(Ready), Ready)
