"""The tunnel process with the agent run locally (no container): hostile bytes from the sandbox
side are dropped, routing keeps each client's replies its own, SIGINT becomes an interrupt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.connect import write_connection_file

from kernelbridge import frames

REPO = Path(__file__).resolve().parents[2]
# Before exec'ing the agent, the fake "container" writes what a hostile sandbox could: garbage,
# JSON that is not an object, an unknown frame type, a reply nobody asked for and a 3 MiB line.
HOSTILE_PREFIX = r"""
import os, sys
out = sys.stdout.buffer
out.write(b"\x00\xffnot json\n[1, 2]\n\"str\"\n{\"type\": \"launch\"}\n")
out.write(b'{"type": "kernel", "channel": "shell", "msg": {"header": {}, "parent_header": {}}}\n')
out.write(b'{"type": "log", "message": "' + b"y" * (3 * 1024 * 1024) + b'"}\n')
out.flush()
os.execv(sys.executable, [sys.executable, "-m", "kernelbridge.sandbox.agent"])
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def tunnel(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    connection_file, _ = write_connection_file(str(tmp_path / "kernel.json"), ip="127.0.0.1", key=b"host-key")
    log_file = tmp_path / "tunnel.log"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelbridge.tunnel", "--connection-file", connection_file,
         "--log-file", str(log_file), "--", sys.executable, "-c", HOSTILE_PREFIX],
        stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    event = json.loads(proc.stdout.readline())
    assert event["event"] == "ready", event
    yield proc, connection_file, log_file
    proc.terminate()
    proc.wait(timeout=10)


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
async def test_hostile_frames_are_logged_and_dropped(tunnel: tuple) -> None:
    _, connection_file, log_file = tunnel
    async with connected(connection_file) as kc:
        reply = await execute(kc, "40 + 2")
        assert reply["content"]["status"] == "ok"
    log = log_file.read_text()
    for reason in ("not JSON", "not a JSON object", "unknown frame type"):
        assert reason in log


@pytest.mark.anyio
async def test_replies_go_to_the_client_that_asked(tunnel: tuple) -> None:
    _, connection_file, _ = tunnel
    async with connected(connection_file) as first, connected(connection_file) as second:
        ids = {first.execute("import time; time.sleep(0.2); 'first'"), second.execute("'second'")}
        got_first = await first.get_shell_msg(timeout=30)
        got_second = await second.get_shell_msg(timeout=30)
        assert got_first["parent_header"]["msg_id"] in ids
        assert got_second["parent_header"]["msg_id"] in ids
        assert got_first["parent_header"]["msg_id"] != got_second["parent_header"]["msg_id"]
        assert got_first["parent_header"]["session"] == first.session.session
        assert got_second["parent_header"]["session"] == second.session.session


@pytest.mark.anyio
async def test_sigint_to_the_tunnel_interrupts_the_kernel(tunnel: tuple) -> None:
    proc, connection_file, _ = tunnel
    async with connected(connection_file) as kc:
        msg_id = kc.execute("import time\nprint('started', flush=True)\nfor _ in range(600): time.sleep(0.1)")
        # Wait for output from the cell itself: ipykernel publishes execute_input before the cell
        # runs, and a SIGINT landing in between is swallowed by its event loop (and the cell lost).
        with anyio.fail_after(10):
            while (await kc.get_iopub_msg(timeout=10))["content"].get("text") != "started\n":
                pass
        proc.send_signal(signal.SIGINT)
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
async def test_malformed_client_messages_do_not_break_the_tunnel(tunnel: tuple) -> None:
    import zmq
    import zmq.asyncio

    proc, connection_file, log_file = tunnel
    info = json.loads(await anyio.Path(connection_file).read_text())
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
    async with connected(connection_file) as kc:
        assert (await execute(kc, "'alive'"))["content"]["status"] == "ok"
    assert proc.poll() is None
    log = log_file.read_text()
    assert "dropped a malformed shell message" in log
    assert "dropped shell message with a bad signature" in log


@pytest.mark.anyio
async def test_sigusr1_restarts_the_kernel_behind_the_same_sockets(tunnel: tuple) -> None:
    proc, connection_file, _ = tunnel
    async with connected(connection_file) as kc:
        await execute(kc, "before_restart = 1")
        proc.send_signal(signal.SIGUSR1)
        event = json.loads(await anyio.to_thread.run_sync(proc.stdout.readline))
        assert event["event"] == "ready"
        reply = await execute(kc, "before_restart")  # the same client, no reconnect
        assert reply["content"]["ename"] == "NameError"
