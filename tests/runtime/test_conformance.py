"""One suite, every backend: what the rest of kernelbridge may rely on from ``RuntimeBackend`` and
its ``ImageStore``.

Parametrized by the ``backend`` fixture (conftest) over the engine API (podman, docker), the CLI
backend (podman, docker) and the local test double; absent ones are skipped with the reason.
Every wait is bounded. The image tests import a root file system of a few MB (``tiny_rootfs``)
and build on top of it: no registry is reachable here, and none is ever asked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import anyio
import pytest
from runtime_harness import LIMITS_PROBE, TEST_RUN_LABEL, make_spec, tiny_rootfs, unique_image

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import ContainerInfo, ContainerState, ContainerStream, RuntimeBackend
from kernelbridge.runtime.flags import size_bytes

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


async def read_exactly(stream: ContainerStream, size: int) -> bytes:
    """Exactly ``size`` bytes of stdout (an EndOfStream before them fails the test)."""
    chunks: list[bytes] = []
    have = 0
    while have < size:
        chunk = await stream.receive(min(1 << 20, size - have))
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


async def wait_exited(backend: RuntimeBackend, container: str) -> ContainerInfo:
    """Poll inspect until the container has exited (bounded by the caller's scope)."""
    while True:
        info = await backend.inspect(container)
        assert info is not None, f"{container} vanished before it was removed"
        if info.state is ContainerState.EXITED:
            return info
        await anyio.sleep(0.05)


def is_engine(backend: RuntimeBackend) -> bool:
    return backend.engine in ("podman", "docker", "kubernetes")


def keeps_an_event_log(backend: RuntimeBackend) -> bool:
    """Whether the engine still tells how a removed container ended (podman's and docker's event
    logs); Kubernetes keeps nothing of a deleted pod's exit code, so ``ended`` says nothing there
    (a pod that ends stays, Succeeded or Failed, and ``inspect`` tells it until it is deleted)."""
    return backend.engine in ("podman", "docker")


def gated(backend: RuntimeBackend, command: tuple[str, ...]) -> tuple[str, ...]:
    """``command`` (``python3 -c CODE``), waiting for one line of stdin first on Kubernetes: a
    pod's process starts before anyone can attach (the agent writes nothing before its hello;
    a probe that prints at once would be heard only in the pod's log). Send ``GO`` after attaching."""
    if backend.engine != "kubernetes":
        return command
    return (*command[:2], "import sys; sys.stdin.readline()\n" + command[2])


async def go(backend: RuntimeBackend, stream: ContainerStream) -> None:
    if backend.engine == "kubernetes":
        await stream.send(b"go\n")


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
        pytest.skip("the local double runs any image name (its containers ignore images)")
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
        container = await backend.create(make_spec(sandbox_image, gated(backend, hog), memory="48m"))
        stream = await backend.attach(container)
        await go(backend, stream)
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
        probe = gated(backend, ("python3", "-c", LIMITS_PROBE))
        container = await backend.create(make_spec(sandbox_image, probe, **limits))
        stream = await backend.attach(container)
        await go(backend, stream)
        out = await read_all(stream)
        tail = stream.stderr_tail()
        await stream.aclose()
        await backend.remove([container])
    assert out, tail
    seen = json.loads(out)
    assert int(seen["memory"]) == size_bytes("200m")
    assert int(seen["memory_swap"]) in (size_bytes("200m"), 0), "no swap beyond the memory limit"
    # A pod has no pids field: the node's podPidsLimit bounds the pod's cgroup (128 on the
    # development cluster, tests/kube/test_sandbox_pod.py), not the container's.
    assert seen["pids"] == ("max" if backend.engine == "kubernetes" else "64")
    assert seen["cpu"] in ("50000 100000",), seen["cpu"]
    assert seen["nofile"] == [1024, 1024] and seen["nproc"] == [4096, 4096]
    assert seen["uid"] == [65534, 65534]
    assert seen["pid"] == 1, "no init process: the command is PID 1"
    assert seen["cwd"] == "/workspace"
    assert seen["tmp"] == [size_bytes("16m"), size_bytes("32m")]
    assert seen["tmp_mode"] == [0o1777, 0o1777]
    # A pod's emptyDir has no mount options (rw only): no-new-privileges and no capabilities
    # leave a set-uid file or a device node there without effect (tests/kube/test_sandbox_pod.py).
    wanted = {"rw"} if backend.engine == "kubernetes" else {"nosuid", "nodev", "rw"}
    for options in seen["tmp_options"]:
        assert wanted <= set(options), options
    assert seen["root_read_only"] is True
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    # A pod gets an eth0 (containerd needs one) that leads nowhere: tests/kube/test_no_network.py.
    assert seen["interfaces"] == (["eth0", "lo"] if backend.engine == "kubernetes" else ["lo"]), "no network"


async def test_remove_is_idempotent(backend: RuntimeBackend, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        never_started = await backend.create(make_spec(sandbox_image, CAT))
        await backend.remove([never_started])
        assert await backend.inspect(never_started) is None
        container = await backend.create(make_spec(sandbox_image, CAT))
        stream = await backend.attach(container)
        await backend.remove([container])  # running: killed
        try:
            assert await read_all(stream) == b""
        except anyio.BrokenResourceError:  # a broken connection is an end too, never a hang
            pass
        await stream.aclose()
        await backend.remove([container, "kbtest-no-such-container"])  # gone: not an error
        await backend.remove([])
        assert await backend.inspect(container) is None


async def receive_line(stream: ContainerStream) -> bytes:
    """stdout up to and including the next newline."""
    got = b""
    while not got.endswith(b"\n"):
        got += await stream.receive()
    return got


async def test_an_exec_session_reaches_a_running_container(
    backend: RuntimeBackend, sandbox_image: str
) -> None:
    """A durable sandbox outlives its first attachment; a later bridge reaches it through an exec
    session (``attach_exec``: its stdin and stdout as a stream), what adopting a detached sandbox
    needs. Backends that cannot (``RuntimeInfo.reattach`` False) refuse a durable spec."""
    spec = make_spec(sandbox_image, CAT, durable=True)
    with anyio.fail_after(STEP):
        if not (await backend.info()).reattach:
            with pytest.raises(RuntimeUnavailable, match="engine API"):
                await backend.create(spec)
            pytest.skip(f"{backend.name} cannot attach again (RuntimeInfo.reattach is False)")
        container = await backend.create(spec)
        try:
            first = await backend.attach(container)
            await first.send(b"one\n")
            assert await receive_line(first) == b"one\n"
            info = await backend.inspect(container)
            assert info is not None and info.state is ContainerState.RUNNING and info.durable, info
            second = await backend.attach_exec(container, ("cat",), user="0")
            await second.send(b"two\n")
            assert await receive_line(second) == b"two\n"
            await second.aclose()
            await first.send(b"three\n")  # the first attachment is untouched by the exec session
            assert await receive_line(first) == b"three\n"
            await first.aclose()
        finally:
            await backend.remove([container])


async def test_how_a_removed_container_ended_is_the_engines_word(
    backend: RuntimeBackend, sandbox_image: str
) -> None:
    """``ended``: once a container is gone, the engine's event log still tells its exit code and
    labels; the test double and Kubernetes, which have no such log, say nothing."""
    spec = make_spec(sandbox_image, ECHO, session="ended")
    with anyio.fail_after(STEP):
        container = await backend.create(spec)
        stream = await backend.attach(container)
        await stream.send_eof()
        assert await read_all(stream) == b""
        await stream.aclose()
        exited = await wait_exited(backend, container)
        await backend.remove([container])
        assert await backend.inspect(container) is None
        told = await backend.ended(container)
    if not keeps_an_event_log(backend):
        assert told is None
        return
    if exited.exit_code == -1:
        # podman waits 5 s for conmon's exit file; on a loaded host it may not come, and podman
        # then records the exit as -1 ("No exit file for container") and logs no death: the
        # engine never learned how it ended, so neither can its event log say.
        assert told is None or told.state is ContainerState.EXITED, told
        return
    assert told is not None and told.state is ContainerState.EXITED, (exited, told)
    assert (told.exit_code, told.oom_killed, told.session, told.name) == (7, False, "ended", spec.name)
    assert told.labels[TEST_RUN_LABEL] == str(os.getpid()) and told.id.startswith(container[:12])
    assert await backend.ended("kbtest-no-such-container") is None


async def test_a_durable_container_is_removed_by_the_engine_once_it_ends(
    backend: RuntimeBackend, sandbox_image: str
) -> None:
    """A durable sandbox may end with no bridge there (its idle timeout): the engine removes it
    itself, and ``ended`` tells how it ended (the agent's status 5, here faked)."""
    waits = ("sh", "-c", "trap 'exit 5' TERM; while :; do sleep 0.2; done")
    spec = make_spec(sandbox_image, waits, durable=True)
    with anyio.fail_after(STEP):
        if not (await backend.info()).reattach or not keeps_an_event_log(backend):
            # Kubernetes removes no pod by itself (the bridges' reaper deletes ended ones by
            # label), and pods/exec reaches only the handover container, not the sandbox's PID 1.
            pytest.skip(f"{backend.name} keeps no durable sandbox of an engine that removes itself")
        container = await backend.create(spec)
        stream = await backend.attach(container)
        await stream.aclose()  # its bridge goes: the sandbox runs on, detached
        info = await backend.inspect(container)
        assert info is not None and info.state is ContainerState.RUNNING, info
        # The sandbox's own uid: root in the container holds no CAP_KILL for another uid's PID 1.
        ending = await backend.attach_exec(container, ("sh", "-c", "kill -TERM 1"), user="65534")
        await read_all(ending)
        await ending.aclose()
        # The engine's removal has no event of ours to wait on; bounded by the step's scope.
        while await backend.inspect(container) is not None:  # noqa: ASYNC110
            await anyio.sleep(0.1)
        told = await backend.ended(container)
    assert told is not None and told.durable and told.exit_code == 5, told


async def test_an_exited_container_is_not_run_again(backend: RuntimeBackend, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        container = await backend.create(make_spec(sandbox_image, ECHO))
        stream = await backend.attach(container)
        await stream.send_eof()
        assert await read_all(stream) == b""
        await stream.aclose()
        await wait_exited(backend, container)
        with pytest.raises(RuntimeUnavailable):
            again = await backend.attach(container)
            await again.aclose()
        info = await backend.inspect(container)
        await backend.remove([container])
    assert info is not None and info.state is ContainerState.EXITED and info.exit_code == 7


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
    # Every byte is read back while the process lives, and only then is stdin closed: that is
    # the tunnel's need (it never depends on what a sandbox writes as it exits). Bytes written
    # in the last moments before a pod exits can be cut by the API server's stream translator
    # (kubernetes/kubernetes#124571), so reading to EndOfStream after EOF would test that defect.
    payload = os.urandom(32 << 20)
    with anyio.fail_after(STEP * 2):
        container = await backend.create(make_spec(sandbox_image, CAT))
        stream = await backend.attach(container)

        async def feed() -> None:
            view = memoryview(payload)
            for offset in range(0, len(payload), 1 << 20):
                await stream.send(bytes(view[offset : offset + (1 << 20)]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            got = await read_exactly(stream, len(payload))
        await stream.send_eof()
        rest = await read_all(stream)
        await stream.aclose()
        info = await wait_exited(backend, container)
        await backend.remove([container])
    assert len(got) == len(payload)
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert rest == b""
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


# -- the image store ----------------------------------------------------------------------------------
async def run_image(backend: RuntimeBackend, image: str) -> bytes:
    """The stdout of a container of ``image`` run with its own CMD and stdin closed at once."""
    spec = make_spec(image)
    container = await backend.create(spec)
    try:
        stream = await backend.attach(container)
        await stream.send_eof()
        out = await read_all(stream)
        if backend.engine == "kubernetes" and not out:
            # The CMD may have run and ended before the attachment (no attach-before-start in
            # Kubernetes): what it wrote is in the pod's log, which the stream's tail is.
            out = "".join(f"{line}\n" for line in stream.stderr_tail()).encode()
        await stream.aclose()
    finally:
        await backend.remove([container])
    return out


async def test_image_import_tag_list_remove(backend: RuntimeBackend, tmp_path: Path) -> None:
    images = backend.images
    tag, other = unique_image("tiny"), unique_image("again")
    repository = tag.rpartition(":")[0]
    mark = {"kbtest.store": str(os.getpid())}
    changes = ['CMD ["cat"]', "LABEL kbtest.store=" + mark["kbtest.store"], 'LABEL kbtest.words="a b c"']
    with anyio.fail_after(STEP):
        assert await images.labels(tag) is None
        await images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), tag, changes)
        try:
            labels = await images.labels(tag)
            assert labels is not None and labels["kbtest.store"] == mark["kbtest.store"]
            assert labels["kbtest.words"] == "a b c", "a quoted label value keeps its spaces"
            await images.tag(tag, other)
            assert await images.labels(other) == labels
            (listed,) = await images.list(repository)
            assert set(listed.tags) == {tag, other} and listed.labels == labels and listed.created > 0
            assert listed.id in {i.id for i in await images.list(labels=mark)}
            assert await images.list(repository, labels={"kbtest.store": "someone-else"}) == []
            if is_engine(backend):
                assert await run_image(backend, tag) == b"", "the imported CMD runs (cat, stdin closed)"
            assert await images.remove(other)  # one of two tags: the image stays
            assert await images.labels(other) is None and await images.labels(tag) == labels
            # A container that uses the image keeps it.
            user = await backend.create(make_spec(tag, CAT))
            try:
                assert not await images.remove(tag)
                assert await images.labels(tag) == labels
            finally:
                await backend.remove([user])
            assert await images.remove(tag)
            assert await images.labels(tag) is None
            assert await images.remove(tag), "removing what is gone is fine"
            assert await images.list(repository) == []
        finally:
            for ref in (tag, other):
                await images.remove(ref)


async def test_image_import_of_a_file_that_is_no_tarball(backend: RuntimeBackend, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tarball\n" * 100)
    tag = unique_image("junk")
    with anyio.fail_after(STEP), pytest.raises(ImageError):
        await backend.images.import_rootfs(junk, tag, ['CMD ["cat"]'])
    with anyio.fail_after(STEP):
        await backend.images.remove(tag)


async def test_image_save_and_load(backend: RuntimeBackend, tmp_path: Path) -> None:
    """An image written to a docker-archive comes back, tag and labels, after it was removed; a
    truncated copy and a missing image are ImageErrors."""
    images = backend.images
    tag = unique_image("saved")
    archive, cut = tmp_path / "image.tar", tmp_path / "cut.tar"
    changes = ['CMD ["cat"]', "LABEL kbtest.saved=1", 'LABEL kbtest.words="a b c"']
    with anyio.fail_after(STEP * 2):
        await images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), tag, changes)
        try:
            labels = await images.labels(tag)
            await images.save(tag, archive)
            await images.remove(tag)
            assert await images.labels(tag) is None
            assert tag in await images.load(archive), "the engine names the tag it loaded"
            assert await images.labels(tag) == labels
            if is_engine(backend):
                assert await run_image(backend, tag) == b"", "the loaded image runs"
            await images.remove(tag)
            data = archive.read_bytes()
            cut.write_bytes(data[: len(data) // 2])
            with pytest.raises(ImageError):
                await images.load(cut)
            with pytest.raises(ImageError):
                await images.save(tag, tmp_path / "gone.tar")
        finally:
            await images.remove(tag)


async def test_image_build_from_a_containerfile(backend: RuntimeBackend, tmp_path: Path) -> None:
    images = backend.images
    base, built = unique_image("base"), unique_image("built")
    context = tmp_path / "context"
    context.mkdir()
    (context / "hello.txt").write_text("hello from the context\n")
    (context / "Containerfile").write_text(
        f"FROM {base}\n"
        "ARG GREETING=none\n"
        "COPY hello.txt /hello.txt\n"
        "LABEL kbtest.built=yes kbtest.greeting=$GREETING\n"
        'CMD ["cat", "/hello.txt"]\n'
    )
    with anyio.fail_after(STEP * 2):
        await images.import_rootfs(
            tiny_rootfs(tmp_path / "tiny.tar"), base, ['CMD ["cat"]', "LABEL kbtest.base=1"]
        )
        try:
            await images.build(context, built, build_args={"GREETING": "hi"})
            labels = await images.labels(built)
            assert labels is not None
            assert (labels["kbtest.built"], labels["kbtest.greeting"], labels["kbtest.base"]) == (
                "yes",
                "hi",
                "1",
            )
            if is_engine(backend):
                assert await run_image(backend, built) == b"hello from the context\n"
            # A base that is not on the engine is an error, never a pull from a registry.
            (context / "Containerfile").write_text("FROM localhost/kbtest-no-such-base:0\nLABEL x=1\n")
            with pytest.raises(ImageError):
                await images.build(context, unique_image("orphan"))
        finally:
            for ref in (built, base):
                await images.remove(ref)
