"""Another client of an engine, in a process of its own: creates, starts, ends and removes
containers in a tight loop, bounded in count and time. Run as a script by tests/runtime/test_races.py:

    python churn.py URL IMAGE LABEL=VALUE OWNER_PID SECONDS COUNT

Its containers carry ``LABEL=VALUE``, the session label and ``OWNER_PID`` as their bridge (a dead
pid makes them orphans that a reaper removes too, racing this process). Prints how many it made.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time

import anyio

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.engine.api import open_engine
from kernelbridge.runtime.engine.endpoint import parse_endpoint
from kernelbridge.runtime.engine.transport import EngineClient

WORKERS = 3


async def churn(url: str, image: str, label: str, owner: int, seconds: float, count: int) -> int:
    runtime = await open_engine(EngineClient(parse_endpoint(url), engine="podman"))
    key, _, value = label.partition("=")
    made = 0
    deadline = time.monotonic() + seconds

    async def worker(n: int) -> None:
        nonlocal made
        while made < count and time.monotonic() < deadline:
            spec = ContainerSpec(
                image=image,
                name=f"kbchurn-{n}-{made}-{time.monotonic_ns() % 10**9}",
                session="churn",
                owner_pid=owner,
                owner_host=socket.gethostname(),
                command=("cat",),
                labels=((key, value),),
            )
            made += 1
            with contextlib.suppress(RuntimeUnavailable):  # the reaper may have removed it first
                container = await runtime.create(spec)
                stream = await runtime.attach(container)
                await stream.send_eof()  # cat ends: the container exits, the engine cleans it up
                await runtime.remove([container])
                await stream.aclose()

    try:
        async with anyio.create_task_group() as tg:
            for n in range(WORKERS):
                tg.start_soon(worker, n)
    finally:
        await runtime.aclose()
    return made


if __name__ == "__main__":
    url, image, label, owner, seconds, count = sys.argv[1:7]
    print(anyio.run(churn, url, image, label, int(owner), float(seconds), int(count)))
