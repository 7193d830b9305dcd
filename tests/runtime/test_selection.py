"""Selecting the runtime (``open_runtime``) and placing sandboxes over several engines.

Real engines only: the placement test runs a podman service over a storage of its own and the
test dockerd, both holding nothing but a tiny image the test imports (so their loads are ours to
count), and checks that each sandbox lands on the least-loaded engine and stays there.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from runtime_harness import (
    make_spec,
    ping,
    remove_private_podman,
    start_private_podman,
    tiny_rootfs,
    unique_image,
)

from kernelbridge.config import EngineSettings, Settings
from kernelbridge.errors import ConfigError, RuntimeUnavailable
from kernelbridge.runtime import ContainerState, open_runtime, open_selection
from kernelbridge.runtime.base import RuntimeInfo
from kernelbridge.runtime.engine.api import EngineRuntime
from kernelbridge.runtime.engine.endpoint import system_sockets
from kernelbridge.runtime.engine.placement import EngineSet

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

STEP = 60.0
TINY = "localhost/kernelbridge-test-tiny:1"


def settings(tmp_path: Path, runtime: str | None = None, **engine: object) -> Settings:
    return Settings(state_dir=tmp_path / "state", runtime=runtime, engine=EngineSettings(**engine))  # type: ignore[arg-type]


async def echo(backend: object, image: str, command: tuple[str, ...] = ("cat",)) -> bytes:
    spec = make_spec(image, command)
    container = await backend.create(spec)  # type: ignore[attr-defined]
    stream = await backend.attach(container)  # type: ignore[attr-defined]
    await stream.send(b"placed\n")
    await stream.send_eof()
    out = b""
    try:
        while True:
            out += await stream.receive()
    except anyio.EndOfStream:
        pass
    await stream.aclose()
    await backend.remove([container])  # type: ignore[attr-defined]
    return out


async def test_podman_api_of_our_own(tmp_path: Path, sandbox_image: str) -> None:
    if any(ping(f"unix://{path}") for path in system_sockets("podman")):
        pytest.skip("a podman system service answers here: it would be picked instead")
    with anyio.fail_after(STEP):
        async with open_selection(settings(tmp_path, "podman-api")) as selected:
            runtime = selected.backend
            assert isinstance(runtime, EngineRuntime)
            assert selected.reason.startswith("podman API at unix://")
            assert selected.reason.endswith("(started by kernelbridge)")
            sock = anyio.Path(runtime.endpoint.path)
            assert await sock.is_socket()
            helper = runtime._helpers[0]
            pid = helper.pid
            assert pid is not None
            assert await echo(runtime, sandbox_image) == b"placed\n"
    # Closing the runtime stops its service and removes its socket and working directory.
    assert not await anyio.Path(f"/proc/{pid}").exists()
    assert not await sock.exists()
    left = [p.name for p in (tmp_path / "state" / "run").glob("podman-service-*") if p.is_dir()]
    assert not left, "the service's working directory is removed with it"


async def test_a_second_bridge_takes_our_own_podmans_info_from_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bridge starts a podman service of its own, on a socket of its own: the second takes
    the info its predecessor kept in this user's cache instead of asking podman (~0.7 CPU-s)."""
    if any(ping(f"unix://{path}") for path in system_sockets("podman")):
        pytest.skip("a podman system service answers here: it would be picked instead")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    asked: list[str] = []
    ask = EngineRuntime._ask_podman_info

    async def counted(runtime: EngineRuntime) -> RuntimeInfo:
        asked.append(runtime.endpoint.url)
        return await ask(runtime)

    monkeypatch.setattr(EngineRuntime, "_ask_podman_info", counted)
    seen: list[tuple[str, RuntimeInfo]] = []
    with anyio.fail_after(STEP):
        for _ in range(2):
            async with open_selection(settings(tmp_path)) as selected:
                assert isinstance(selected.backend, EngineRuntime)
                assert selected.reason.endswith("(started by kernelbridge)")
                seen.append((selected.backend.endpoint.url, await selected.backend.info()))
    (first_url, first), (second_url, second) = seen
    assert asked == [first_url]
    assert first_url != second_url
    assert second == replace(first, endpoint=second_url)


async def test_docker_host_is_honoured(tmp_path: Path, docker_url: str, sandbox_image: str) -> None:
    with anyio.fail_after(STEP):
        async with open_selection(settings(tmp_path, "docker", docker_host=docker_url)) as selected:
            assert selected.backend.name == "docker-api"
            assert selected.reason == f"docker API at {docker_url} (DOCKER_HOST)"
            info = await selected.backend.info()
            assert info.engine == "docker" and info.endpoint == docker_url and info.limits_enforced
            assert await echo(selected.backend, sandbox_image) == b"placed\n"


async def test_an_unreachable_engine_is_one_line(tmp_path: Path) -> None:
    s = settings(tmp_path, "docker-api", docker_host="unix:///nonexistent/docker.sock")
    with anyio.fail_after(STEP), pytest.raises(RuntimeUnavailable) as info:
        async with open_runtime(s):
            pass
    assert str(info.value) == (
        "cannot reach the docker engine at unix:///nonexistent/docker.sock: no such socket; "
        "is dockerd running?"
    )


async def test_docker_api_without_any_engine(tmp_path: Path) -> None:
    if any(ping(f"unix://{path}") for path in system_sockets("docker")):
        pytest.skip("a dockerd answers on the system socket")
    with (
        anyio.fail_after(STEP),
        pytest.raises(RuntimeUnavailable, match=r"^no docker engine answers: cannot"),
    ):
        async with open_runtime(settings(tmp_path, "docker-api")):
            pass


async def test_the_cli_as_fallback_says_why(tmp_path: Path) -> None:
    if any(ping(f"unix://{path}") for path in system_sockets("docker")):
        pytest.skip("a dockerd answers on the system socket")
    with anyio.fail_after(STEP):
        async with open_selection(settings(tmp_path, "docker")) as selected:
            assert selected.backend.name == "docker-cli"
            assert selected.reason == "docker CLI: no engine socket answered"
        async with open_selection(settings(tmp_path, "podman-cli")) as selected:
            assert selected.backend.name == "podman-cli"
            assert selected.reason == "podman CLI: KERNELBRIDGE_RUNTIME=podman-cli"


async def test_engines_with_the_cli_is_a_contradiction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs the engine API"):
        async with open_runtime(settings(tmp_path, "podman-cli", urls=("unix:///x",))):
            pass


@pytest.fixture
def private_podman() -> Iterator[str]:
    """A podman service over its own storage: nothing lives there that we did not put there."""
    directory = Path(tempfile.mkdtemp(prefix="kbpp-"))
    service = start_private_podman(directory)
    try:
        yield f"unix://{directory}/p.sock"
    finally:
        service.stop()
        remove_private_podman(directory)


async def test_an_engine_set_puts_images_on_every_engine(
    tmp_path: Path, private_podman: str, docker_url: str
) -> None:
    with anyio.fail_after(STEP * 2):
        async with open_selection(settings(tmp_path, urls=(private_podman, docker_url))) as selected:
            engines = selected.backend
            assert isinstance(engines, EngineSet)
            images = engines.images
            tag, built = unique_image("set"), unique_image("set-built")
            try:
                await images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), tag, ["LABEL tiny=1"])
                assert await images.labels(tag) == {"tiny": "1"}
                for backend in engines.backends:
                    assert await backend.images.labels(tag) == {"tiny": "1"}, backend
                listed = await images.list(tag.rpartition(":")[0])
                assert [tag in i.tags for i in listed] == [True, True], "one image per engine"
                context = tmp_path / "context"
                context.mkdir()
                (context / "Containerfile").write_text(f"FROM {tag}\nLABEL built=1\n")
                await images.build(context, built)
                for backend in engines.backends:
                    labels = await backend.images.labels(built) or {}
                    assert {"tiny": "1", "built": "1"}.items() <= labels.items(), (backend, labels)
                # Missing on one engine is missing for the set: a sandbox could not be placed there.
                assert await engines.backends[1].images.remove(built)
                assert await images.labels(built) is None
                assert await images.remove(built) and await images.remove(tag)
                for backend in engines.backends:
                    assert await backend.images.labels(tag) is None, backend
            finally:
                for ref in (built, tag):
                    await images.remove(ref)


async def test_least_loaded_placement(tmp_path: Path, private_podman: str, docker_url: str) -> None:
    urls = (private_podman, docker_url)
    with anyio.fail_after(STEP * 2):
        async with open_selection(settings(tmp_path, urls=urls)) as selected:
            engines = selected.backend
            assert isinstance(engines, EngineSet)
            assert selected.reason == f"2 engines, least-loaded placement: {private_podman}, {docker_url}"
            podman, docker = engines.backends
            assert (podman.engine, docker.engine) == ("podman", "docker")
            # The same image on both (an import goes to every engine).
            await engines.images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), TINY, ['CMD ["cat"]'])
            try:
                await place_four(engines)
            finally:
                await engines.images.remove(TINY)


async def place_four(engines: EngineSet) -> None:
    base = await engines.loads()
    assert base[0] is not None and base[1] is not None
    # Fill in from the less loaded engine; ties go to the first listed (podman).
    specs = [make_spec(TINY, ("cat",), session=f"p{i}") for i in range(4)]
    placed: list[str] = []
    for spec in specs:
        before = await engines.loads()
        expected = min((load, i) for i, load in enumerate(before) if load is not None)[1]
        container = await engines.create(spec)
        on = [b for b in engines.backends if await b.inspect(container) is not None]
        assert on == [engines.backends[expected]], f"{spec.name} went to {on}, loads {before}"
        placed.append(container)
    after = await engines.loads()
    assert sum(a - b for a, b in zip(after, base, strict=True)) == 4  # type: ignore[operator]
    assert abs(after[0] - after[1]) <= max(1, abs(base[0] - base[1]))  # type: ignore[operator]
    # Every later call reaches the container's own engine.
    stream = await engines.attach(placed[1])
    await stream.send(b"stays put\n")
    assert await stream.receive() == b"stays put\n"
    info = await engines.inspect(placed[1])
    assert info is not None and info.state is ContainerState.RUNNING
    await stream.aclose()
    listed = {c.id for c in await engines.list({"kernelbridge.test-run": str(os.getpid())})}
    assert set(placed) <= listed
    await engines.remove(placed)
    assert [await engines.inspect(c) for c in placed] == [None] * 4
    assert await engines.loads() == base


async def test_placement_skips_an_engine_that_stopped(tmp_path: Path, docker_url: str) -> None:
    directory = Path(tempfile.mkdtemp(prefix="kbpp-"))
    service = start_private_podman(directory)
    try:
        urls = (f"unix://{directory}/p.sock", docker_url)
        with anyio.fail_after(STEP):
            async with open_selection(settings(tmp_path, urls=urls)) as selected:
                engines = selected.backend
                assert isinstance(engines, EngineSet)
                service.stop()
                assert (await engines.loads())[0] is None
                assert await engines.place() is engines.backends[1]
    finally:
        service.stop()
        remove_private_podman(directory)
