"""The tunnel's writes to a sandbox's stdin when the sandbox stops reading it (a frozen
container): a real pipe to a process that reads only when told. No writer is held past the write
bound, the stuck write fails within it, and the sandbox's end then sees its stdin close."""

from __future__ import annotations

import contextlib
import json
import signal
import sys

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.stapled import StapledByteStream

from kernelbridge import frames
from kernelbridge.tunnel import core
from kernelbridge.tunnel.core import Tunnel

pytestmark = pytest.mark.anyio

BOUND = 0.5
"""The write bound of this test (SEND_TIMEOUT, 30 s by default, is what it is about)."""
READS_WHEN_TOLD = """
import json, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
print("frozen", flush=True)
signal.sigwait([signal.SIGUSR1])  # nothing of stdin is read until then
data = sys.stdin.buffer.read()  # until EOF
print(json.dumps({"frames": data.count(b"\\n"), "interrupt": b'"interrupt"' in data}), flush=True)
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_sandbox_that_stops_reading_holds_no_writer_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "SEND_TIMEOUT", BOUND)  # the bound is what this test is about
    big = {"type": frames.LOG, "message": "x" * (8 * 1024 * 1024)}  # far past a pipe's 64 KiB
    done: list[str] = []
    async with await anyio.open_process([sys.executable, "-c", READS_WHEN_TOLD]) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            out = BufferedByteReceiveStream(child.stdout)
            with anyio.fail_after(20):
                assert await out.receive_until(b"\n", 100) == b"frozen"
            stdio = StapledByteStream(child.stdin, out)
            tunnel = Tunnel(stdio, None, connection=None, session="stuck", kernel_key="k")  # type: ignore[arg-type]

            async def write(name: str, frame: frames.Frame) -> None:
                await tunnel.send_frame(frame)
                done.append(name)

            with anyio.fail_after(4 * BOUND):  # without a bound both writers wait for ever
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write, "stuck", big)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(write, "waiting", {"type": frames.INTERRUPT})
            assert done == ["stuck", "waiting"]
            await tunnel.send_frame({"type": frames.INTERRUPT})  # later writes are dropped at once
            child.send_signal(signal.SIGUSR1)
            with anyio.fail_after(20):  # it reads to the end of stdin: stdin was closed
                line = await out.receive_until(b"\n", 1000)
                await child.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                child.kill()  # a failure must not wait for a child that never reads
    # What the stuck write had handed over may arrive; nothing was written after it.
    assert json.loads(line) == {"frames": 1, "interrupt": False}
