"""One suite, every backend: what the rest of kernelbridge may rely on from ``RuntimeBackend``.

Parametrized by the ``backend`` fixture (conftest) over the engine API (podman, docker) and, once
they are on this branch, the CLI backend and the local test double; absent ones are skipped with
the reason. Every wait is bounded.
"""

from __future__ import annotations

import hashlib
import json
import os

import anyio
import pytest
from runtime_harness import LIMITS_PROBE, TEST_RUN_LABEL, make_spec

from kernelbridge.errors import ImageError
from kernelbridge.runtime.base import ContainerState, ContainerStream, RuntimeBackend
from kernelbridge.runtime.engine_spec import size_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

STEP = 60.0
"""Bound of one step of a test (a create, an echo, a container's exit) on a loaded 2-core machine."""

ECHO = ("python3", "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()); sys.exit(7)")
CAT = ("cat",)


async def read_all(stream: ContainerStream, limit: int = 64 << 20) -> bytes:
    """stdout until EndOfStream (at most ``limit`` bytes)."""
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = await stream.receive(1 << 20)
            chunks.append(chunk)
            size += len(chunk)
    except anyio.EndOfStream:
        return b"".join(chunks)
    raise AssertionError(f"more than {limit} bytes of output")


async def wait_exited(backend: RuntimeBackend, container: str) -> object:
    """Poll inspect until the container has exited (bounded by the caller's scope)."""
    while True:
        info = await backend.inspect(container)
        assert info is not None, f"{container} vanished before it was removed"
        if info.state is ContainerState.EXITED:
            return info
        await anyio.sleep(0.05)


def is_engine(backend: RuntimeBackend) -> bool:
    return backend.engine in ("podman", "docker")


async def test_echo_exit_code_and_removal(backend: RuntimeBackend, sandbox_image: str) -> None:
    spec = make_spec(sandbox_image, ECHO)
    with anyio.fail_after(STEP):
        container = await backend.create(spec)
        info = await backend.inspect(container)
        assert info is not None and info.state is ContainerState.CREATED and info.name == spec.name
        stream = await backend.attach(container)
        await stream.send(b"hello ")
        await stream.send(b"sandbox\n")
        await stream.send_eof()
        assert await read_all(stream) == b"hello sandbox\n"
        await stream.aclose()
        info = await wait_exited(backend, container)
    assert info.exit_code == 7 and not info.oom_killed  # type: ignore[attr-defined]
    with anyio.fail_after(STEP):
        await backend.remove([container])
        assert await backend.inspect(container) is None
        assert await backend.inspect(spec.name) is None


async def test_labels_and_list(backend: RuntimeBackend, sandbox_image: str) -> None:
    a = make_spec(sandbox_image, CAT, session="alpha")
    b = make_spec(sandbox_image, CAT, session="beta")
    with anyio.fail_after(STEP):
        ids = [await backend.create(a), await backend.create(b)]
        mine = {TEST_RUN_LABEL: str(os.getpid())}
        listed = {c.name: c for c in await backend.list(mine)}
        assert set(listed) >= {a.name, b.name}
        assert listed[a.name].session == "alpha" and listed[a.name].owner_pid == os.getpid()
        assert listed[a.name].state is ContainerState.CREATED
        only_beta = await backend.list({**mine, "kernelbridge.session": "beta"})
        assert [c.name for c in only_beta] == [b.name]
        # The default lists every kernelbridge container (an empty value matches any value).
        assert {a.name, b.name} <= {c.name for c in await backend.list()}
        await backend.remove(ids)
        assert not {a.name, b.name} & {c.name for c in await backend.list(mine)}


async def test_stderr_tail_of_a_failing_start(backend: RuntimeBackend, sandbox_image: str) -> None:
    script = (
        "import sys\n"
        "for i in range(100): print('line', i, file=sys.stderr)\n"
        "print('x' * 100000, file=sys.stderr)\n"
        "print('the agent failed: bad hello', file=sys.stderr)\n"
        "sys.exit(3)"
    )
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, ("python3", "-c", script)))
        stream = await backend.attach(container)
        assert await read_all(stream) == b""
        tail = stream.stderr_tail()
        await stream.aclose()
        info = await wait_exited(backend, container)
        await backend.remove([container])
    assert tail[-1] == "the agent failed: bad hello"
    assert "line 99" in tail
    assert len(tail) <= 64 and all(len(line) <= 1000 for line in tail), "the tail is bounded"
    assert info.exit_code == 3  # type: ignore[attr-defined]


async def test_missing_image_is_an_image_error(backend: RuntimeBackend) -> None:
    if not is_engine(backend):
        pytest.skip("the local double has no images")
    spec = make_spec("localhost/kernelbridge-no-such-image:0", CAT)
    with anyio.fail_after(STEP), pytest.raises(ImageError, match=r"missing.*kernelbridge image build"):
        await backend.create(spec)
    with anyio.fail_after(STEP):
        assert await backend.inspect(spec.name) is None


async def test_oom_kill_is_reported(backend: RuntimeBackend, sandbox_image: str) -> None:
    if not is_engine(backend):
        pytest.skip("the local double has no memory limit")
    hog = ("python3", "-c", "import sys; print('start', flush=True); b = b'x' * (400 << 20)")
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, hog, memory="48m"))
        stream = await backend.attach(container)
        assert await read_all(stream) == b"start\n"
        await stream.aclose()
        info = await wait_exited(backend, container)
        await backend.remove([container])
    assert info.oom_killed, info  # type: ignore[attr-defined]
    assert info.exit_code == 137  # type: ignore[attr-defined]


async def test_limits_are_applied(backend: RuntimeBackend, sandbox_image: str) -> None:
    if not is_engine(backend):
        pytest.skip("the local double applies no limits")
    limits = {"memory": "200m", "pids": 64, "cpus": 0.5, "tmp_size": "16m", "workspace_size": "32m"}
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, ("python3", "-c", LIMITS_PROBE), **limits))
        stream = await backend.attach(container)
        out = await read_all(stream)
        tail = stream.stderr_tail()
        await stream.aclose()
        await backend.remove([container])
    assert out, tail
    seen = json.loads(out)
    assert int(seen["memory"]) == size_bytes("200m")
    assert int(seen["memory_swap"]) in (size_bytes("200m"), 0), "no swap beyond the memory limit"
    assert seen["pids"] == "64"
    assert seen["cpu"] in ("50000 100000",), seen["cpu"]
    assert seen["nofile"] == [1024, 1024] and seen["nproc"] == [4096, 4096]
    assert seen["uid"] == [65534, 65534]
    assert seen["pid"] == 1, "no init process: the command is PID 1"
    assert seen["cwd"] == "/workspace"
    assert seen["tmp"] == [size_bytes("16m"), size_bytes("32m")]
    assert seen["tmp_mode"] == [0o1777, 0o1777]
    for options in seen["tmp_options"]:
        assert {"nosuid", "nodev", "rw"} <= set(options), options
    assert seen["root_read_only"] is True
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["interfaces"] == ["lo"], "network none"


async def test_stop_and_remove_are_idempotent(backend: RuntimeBackend, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, CAT))
        await backend.stop(container)  # never started
        stream = await backend.attach(container)
        await backend.stop(container, timeout=1)  # cat dies on SIGTERM at once
        assert await read_all(stream) == b""
        await stream.aclose()
        info = await wait_exited(backend, container)
        await backend.stop(container)  # already stopped
        await backend.remove([container])
        await backend.remove([container, "kbtest-no-such-container"])  # gone: not an error
        await backend.stop(container)
        assert await backend.inspect(container) is None
    # 128 + SIGTERM/SIGKILL from an engine; the local double reports a signal as -N (Popen's way).
    assert info.exit_code in (143, 137, -15, -9)  # type: ignore[attr-defined]


async def test_remove_while_running_ends_the_stream(backend: RuntimeBackend, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, CAT))
        stream = await backend.attach(container)
        await stream.send(b"ping\n")
        assert await stream.receive() == b"ping\n"
        info = await backend.inspect(container)
        assert info is not None and info.state is ContainerState.RUNNING
        await backend.remove([container])
        assert await backend.inspect(container) is None
        try:
            rest = await read_all(stream)  # ends: EndOfStream ...
        except anyio.BrokenResourceError:  # ... or a broken connection, never a hang
            rest = b""
        assert rest == b""
        await stream.aclose()


async def test_32_mib_through_stdin_and_stdout(backend: RuntimeBackend, sandbox_image: str) -> None:
    payload = os.urandom(32 << 20)
    got: list[bytes] = []
    with anyio.fail_after(STEP * 2):
        container = await backend.create(make_spec(sandbox_image, CAT))
        stream = await backend.attach(container)

        async def feed() -> None:
            view = memoryview(payload)
            for offset in range(0, len(payload), 1 << 20):
                await stream.send(bytes(view[offset : offset + (1 << 20)]))
            await stream.send_eof()

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            got.append(await read_all(stream, limit=64 << 20))
        await stream.aclose()
        info = await wait_exited(backend, container)
        await backend.remove([container])
    assert len(got[0]) == len(payload)
    assert hashlib.sha256(got[0]).digest() == hashlib.sha256(payload).digest()
    assert info.exit_code == 0  # type: ignore[attr-defined]


async def test_ten_sandboxes_attached_at_once(backend: RuntimeBackend, sandbox_image: str) -> None:
    specs = [make_spec(sandbox_image, CAT, session=f"s{i}") for i in range(10)]
    answers: dict[int, bytes] = {}

    async def one(i: int) -> None:
        container = await backend.create(specs[i])
        stream = await backend.attach(container)
        message = f"sandbox {i} says {'x' * i * 1000}\n".encode()
        await stream.send(message)
        await stream.send_eof()
        answers[i] = await read_all(stream)
        await stream.aclose()
        await backend.remove([container])

    with anyio.fail_after(STEP * 2):
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(one, i)
    assert answers == {i: f"sandbox {i} says {'x' * i * 1000}\n".encode() for i in range(10)}


async def test_send_after_eof_and_close_are_refused(backend: RuntimeBackend, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, CAT))
        stream = await backend.attach(container)
        await stream.send_eof()
        with pytest.raises(anyio.ClosedResourceError):
            await stream.send(b"late")
        assert await read_all(stream) == b""
        await stream.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await stream.receive()
        await backend.remove([container])


async def test_a_cancelled_receive_loses_nothing(backend: RuntimeBackend, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, CAT))
        stream = await backend.attach(container)
        # A receive cancelled while waiting (a cell's timeout) leaves the stream usable and
        # consumes nothing.
        with anyio.move_on_after(0.2) as scope:
            await stream.receive()
        assert scope.cancelled_caught
        await stream.send(b"after the timeout\n")
        got = b""
        while got != b"after the timeout\n":
            got += await stream.receive()
        await stream.send_eof()
        assert await read_all(stream) == b""
        await stream.aclose()
        await backend.remove([container])


async def test_a_cancelled_attach_leaves_a_removable_container(
    backend: RuntimeBackend, sandbox_image: str
) -> None:
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, CAT))
        with anyio.CancelScope() as scope:
            scope.cancel()  # cancelled before the engine answered: nothing half-attached leaks
            await backend.attach(container)
        await backend.remove([container])
        assert await backend.inspect(container) is None
