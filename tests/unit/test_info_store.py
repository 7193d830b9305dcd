"""A local podman's info kept on disk (``runtime/info_store.py``): another process reuses it, any
part of its key changing, its age or a file not as written makes the engine asked again, and only
a local podman's opener keeps it (an in-process engine stand-in on a unix socket and on tcp)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from kernelbridge.config import EngineSettings, Settings
from kernelbridge.runtime import cli_runtime
from kernelbridge.runtime.base import RuntimeInfo
from kernelbridge.runtime.engine.connect import connect_engine
from kernelbridge.runtime.info_store import FILE_NAME, STORE_TTL, InfoCache, InfoStore, cache_dir, forget

pytestmark = pytest.mark.anyio

INFO = RuntimeInfo(
    name="podman-api",
    engine="podman",
    version="4.3.1",
    endpoint="unix:///run/one.sock",
    rootless=True,
    cgroup_version="v2",
    oci_runtime="crun",
    limits_enforced=True,
    storage_driver="overlay",
    reattach=True,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Machine:
    """What the key stamps, all in a temp dir: podman's executable, the user's config, the boot."""

    root: Path
    env: pytest.MonkeyPatch
    clock: list[float]

    @property
    def executable(self) -> Path:
        return self.root / "bin" / "podman"

    @property
    def config(self) -> Path:
        return self.root / "config" / "containers"

    @property
    def boot(self) -> Path:
        return self.root / "boot_id"

    def store(self, **change: Any) -> InfoStore:
        """A fresh store (as another process would make it) of this machine."""
        base = InfoStore(
            where="service",
            executable=str(self.executable),
            name="podman-api",
            endpoint="unix:///run/one.sock",
            version="4.3.1",
            directory=self.root / "cache",
            clock=lambda: self.clock[0],
            boot_file=self.boot,
        )
        return replace(base, **change)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    m = Machine(tmp_path, monkeypatch, [1_000_000.0])
    m.executable.parent.mkdir()
    m.executable.write_bytes(b"podman 4.3.1")
    m.config.mkdir(parents=True)
    m.boot.write_text("boot-1\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for variable in ("CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE", "CONTAINERS_STORAGE_CONF"):
        monkeypatch.delenv(variable, raising=False)
    return m


class Asker:
    """``ask`` for an InfoCache, counting the asks."""

    def __init__(self, info: RuntimeInfo = INFO) -> None:
        self.info, self.calls = info, 0

    async def __call__(self) -> RuntimeInfo:
        self.calls += 1
        return self.info


async def test_another_process_reuses_the_kept_info(machine: Machine) -> None:
    first = Asker()
    assert await InfoCache(store=machine.store()).get(first) == INFO
    assert first.calls == 1
    second = Asker(replace(INFO, rootless=False))  # what the engine would say: not asked
    assert await InfoCache(store=machine.store()).get(second) == INFO
    assert second.calls == 0
    kept = machine.root / "cache" / FILE_NAME
    assert (kept.stat().st_mode & 0o777, kept.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert [p.name for p in kept.parent.iterdir()] == [FILE_NAME]  # no temp file left


async def test_an_answer_is_kept_under_the_configuration_it_was_asked_under(machine: Machine) -> None:
    """podman's configuration edited while podman answers: the answer may be the old
    configuration's, so it is not kept under the new one's key (the next ask goes to podman)."""

    class EditingAsker(Asker):
        async def __call__(self) -> RuntimeInfo:
            (machine.config / "containers.conf").write_text("[engine]\n")
            return await super().__call__()

    await InfoCache(store=machine.store()).get(EditingAsker())
    asker = Asker()
    await InfoCache(store=machine.store()).get(asker)
    assert asker.calls == 1


async def test_the_kept_info_names_the_backend_reading_it(machine: Machine) -> None:
    await InfoCache(store=machine.store()).get(Asker())
    # A bridge's own service is on a new socket each time: the info is the new backend's.
    other = machine.store(endpoint="unix:///run/two.sock", name="podman-api")
    asker = Asker()
    info = await InfoCache(store=other).get(asker)
    assert asker.calls == 0 and info == replace(INFO, endpoint="unix:///run/two.sock")


def test_every_field_but_name_and_endpoint_is_kept(machine: Machine) -> None:
    """A field added to RuntimeInfo and not kept would come back as its default."""
    values = {f.name: f"v-{f.name}" if f.type == "str" else not f.default for f in fields(RuntimeInfo)}
    info = RuntimeInfo(**{**values, "engine": "podman"})
    store = machine.store()
    store.keep(store.key(), info)
    assert machine.store(name=info.name, endpoint=info.endpoint).lookup()[1] == info


def touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def changed(m: Machine, change: str) -> InfoStore:
    """The store of the machine ``m`` after ``change``."""
    match change:
        case "version":
            return m.store(version="4.9.0")
        case "user":
            return m.store(uid=os.geteuid() + 1)
        case "boot":
            m.boot.write_text("boot-2\n")
        case "oci runtime":
            return m.store(oci_runtime="runc")
        case "which podman":
            return m.store(where="socket:/run/podman/podman.sock")
        case "executable replaced":
            m.executable.write_bytes(b"podman 4.9.0")
        case "executable touched":
            touch_later(m.executable)
        case "another executable":
            (m.root / "bin" / "podman2").write_bytes(b"podman 4.3.1")
            return m.store(executable=str(m.root / "bin" / "podman2"))
        case "containers.conf made":
            (m.config / "containers.conf").write_text("[engine]\n")
        case "storage.conf touched":
            touch_later(m.config / "storage.conf")
        case "CONTAINERS_CONF set":
            m.env.setenv("CONTAINERS_CONF", str(m.boot))
    return m.store()


CHANGES = [
    "version",
    "user",
    "boot",
    "oci runtime",
    "which podman",
    "executable replaced",
    "executable touched",
    "another executable",
    "containers.conf made",
    "storage.conf touched",
    "CONTAINERS_CONF set",
]


@pytest.mark.parametrize("change", CHANGES)
async def test_any_part_of_the_key_changing_asks_again(machine: Machine, change: str) -> None:
    (machine.config / "storage.conf").write_text("[storage]\n")
    await InfoCache(store=machine.store()).get(Asker())
    assert machine.store().lookup()[1] is not None  # unchanged: kept
    asker = Asker()
    await InfoCache(store=changed(machine, change)).get(asker)
    assert asker.calls == 1


async def test_the_kept_info_is_asked_again_when_it_is_too_old(machine: Machine) -> None:
    store = machine.store()
    store.keep(store.key(), INFO)
    machine.clock[0] += STORE_TTL - 1
    assert machine.store().lookup()[1] == INFO
    machine.clock[0] += 1
    assert machine.store().lookup()[1] is None
    machine.clock[0] -= 2 * STORE_TTL  # saved "in the future": a clock set back
    assert machine.store().lookup()[1] is None
    asker = Asker()
    await InfoCache(store=machine.store()).get(asker)
    assert asker.calls == 1


def mangled(data: dict[str, Any], how: str) -> bytes:
    (entry,) = data["entries"].values()
    info = entry["info"]
    if how == "limits as a string":
        info["limits_enforced"] = "yes"
    elif how == "rootless as a number":
        info["rootless"] = 1
    elif how == "an extra field":
        info["trusted"] = True
    elif how == "a missing field":
        del info["storage_driver"]
    elif how == "docker's":
        info["engine"] = "docker"
    elif how == "saved as text":
        entry["saved"] = str(entry["saved"])
    elif how == "another format":
        data["format"] = 2
    elif how == "format true":
        data["format"] = True
    elif how == "entries a list":
        data["entries"] = list(data["entries"].values())
    elif how == "an extra top-level key":
        data["note"] = ""
    else:
        return {"not json": b"garbage{", "empty": b"", "nested": b"[" * 60_000, "binary": b"\xff\xfe"}[how]
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "how",
    [
        "limits as a string",
        "rootless as a number",
        "an extra field",
        "a missing field",
        "docker's",
        "saved as text",
        "another format",
        "format true",
        "entries a list",
        "an extra top-level key",
        "not json",
        "empty",
        "nested",
        "binary",
    ],
)
async def test_a_file_not_as_written_is_not_read(machine: Machine, how: str) -> None:
    store = machine.store()
    store.keep(store.key(), INFO)
    assert store.lookup()[1] == INFO
    store.file.write_bytes(mangled(json.loads(store.file.read_bytes()), how))
    assert store.lookup()[1] is None
    asker = Asker()
    assert await InfoCache(store=machine.store()).get(asker) == INFO
    assert asker.calls == 1
    assert machine.store().lookup()[1] == INFO  # and the next ask's answer is kept again


async def test_nothing_is_kept_where_it_cannot_be_written(machine: Machine) -> None:
    (machine.root / "a-file").write_text("")
    store = machine.store(directory=machine.root / "a-file" / "cache")
    asker = Asker()
    for _ in range(2):
        assert await InfoCache(store=store).get(asker) == INFO
    assert asker.calls == 2


async def test_a_directory_others_may_write_is_neither_read_nor_written(machine: Machine) -> None:
    store = machine.store()
    store.keep(store.key(), INFO)
    store.file.parent.chmod(0o777)
    assert store.lookup()[1] is None
    store.file.unlink()
    store.keep(store.key(), INFO)
    assert not store.file.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_of_another_user_is_not_read(machine: Machine) -> None:
    store = machine.store()
    store.keep(store.key(), INFO)
    os.chown(store.file, 12345, 12345)
    assert store.lookup()[1] is None


def test_a_symlink_is_not_followed(machine: Machine) -> None:
    store = machine.store()
    store.keep(store.key(), INFO)
    elsewhere = machine.root / "elsewhere.json"
    store.file.rename(elsewhere)
    store.file.symlink_to(elsewhere)
    assert store.lookup()[1] is None


def test_forget_drops_the_kept_infos(machine: Machine) -> None:
    store = machine.store()
    store.keep(store.key(), INFO)
    forget(store.file.parent)
    assert store.lookup()[1] is None
    forget(store.file.parent)  # nothing to forget: no error


def test_the_cache_directory_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path / "c")}) == tmp_path / "c" / "kernelbridge"
    assert cache_dir({"XDG_CACHE_HOME": "relative"}) == tmp_path / "home" / ".cache" / "kernelbridge"
    assert cache_dir({}) == tmp_path / "home" / ".cache" / "kernelbridge"


# -- who keeps it: the openers ------------------------------------------------------------------


@dataclass
class FakeEngine:
    """An engine API stand-in served in this process on a unix socket and on tcp: answers
    ``/_ping`` as podman (or docker) does and counts the asks for its info."""

    socket: str
    tcp: str
    asked: list[str]
    engine: str = "podman"


LIBPOD_INFO = {
    "host": {"cgroupVersion": "v2", "security": {"rootless": False}, "ociRuntime": {"name": "crun"}},
    "store": {"graphDriverName": "overlay"},
    "version": {"Version": "4.3.1"},
}


@pytest.fixture
async def fake_engine(machine: Machine) -> AsyncIterator[FakeEngine]:
    directory = Path(tempfile.mkdtemp(prefix="kbi-"))  # a short path: sun_path holds 108 bytes
    fake = FakeEngine(str(directory / "engine.sock"), "", [])

    async def serve(stream: anyio.abc.ByteStream) -> None:
        buffered = b""
        async with stream:
            try:
                while True:
                    while b"\r\n\r\n" not in buffered:
                        buffered += await stream.receive()
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    path = head.split(b" ")[1].decode().split("?")[0]
                    headers = {"Libpod-Api-Version": "4.3.1"} if fake.engine == "podman" else {}
                    body: object = "OK"
                    if path.endswith("/libpod/info"):
                        fake.asked.append(path)
                        body = LIBPOD_INFO
                    elif path.endswith("/info"):
                        fake.asked.append(path)
                        body = {"CgroupVersion": "2", "Driver": "overlay2"}
                    elif path.endswith("/version"):
                        body = {"Version": "27.5.1"}
                    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                    lines = [
                        "HTTP/1.1 200 OK",
                        "Content-Type: application/json",
                        f"Content-Length: {len(data)}",
                    ]
                    lines += [f"{k}: {v}" for k, v in headers.items()]
                    await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    unix = await anyio.create_unix_listener(fake.socket)
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    fake.tcp = f"tcp://127.0.0.1:{tcp.extra(anyio.abc.SocketAttribute.local_port)}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(unix.serve, serve)
        tg.start_soon(tcp.serve, serve)
        yield fake
        tg.cancel_scope.cancel()
    await unix.aclose()
    await tcp.aclose()
    await anyio.Path(fake.socket).unlink()
    await anyio.Path(directory).rmdir()


async def infos(url: str, tmp_path: Path, times: int = 2) -> list[RuntimeInfo]:
    """``times`` processes' worth of opening the engine at ``url`` and asking its info."""
    found = []
    for _ in range(times):
        runtime = await connect_engine(url, Settings(state_dir=tmp_path / "state"))
        try:
            found.append(await runtime.info())
        finally:
            await runtime.aclose()
    return found


async def test_a_local_podman_socket_is_asked_once(fake_engine: FakeEngine, tmp_path: Path) -> None:
    with anyio.fail_after(10):
        first, second = await infos(f"unix://{fake_engine.socket}", tmp_path)
    assert len(fake_engine.asked) == 1 and fake_engine.asked[0].endswith("/libpod/info")
    assert first == second and first.endpoint == f"unix://{fake_engine.socket}"
    assert (cache_dir() / FILE_NAME).exists()


async def test_a_remote_engine_is_asked_every_time(fake_engine: FakeEngine, tmp_path: Path) -> None:
    with anyio.fail_after(10):
        await infos(fake_engine.tcp, tmp_path)
    assert len(fake_engine.asked) == 2
    assert not cache_dir().exists()  # neither written nor (so) read


async def test_docker_on_a_local_socket_is_asked_every_time(fake_engine: FakeEngine, tmp_path: Path) -> None:
    fake_engine.engine = "docker"
    with anyio.fail_after(10):
        await infos(f"unix://{fake_engine.socket}", tmp_path)
    assert len(fake_engine.asked) == 2 and all(p.endswith("/info") for p in fake_engine.asked)
    assert not cache_dir().exists()


@pytest.fixture
def fake_podman_on_path(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    machine.executable.chmod(0o755)  # found on PATH by the selection; never run (FakeCli below)
    monkeypatch.setenv("PATH", str(machine.executable.parent))
    monkeypatch.delenv("CONTAINER_CONNECTION", raising=False)
    monkeypatch.delenv("CONTAINER_HOST", raising=False)
    yield


class FakeCli:
    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    async def run(self, *args: str, **_: object) -> str:
        self.asked.append(args)
        if args == ("--version",):
            return "podman version 4.3.1\n"
        host = {"security": {"rootless": False}, "cgroupVersion": "v2", "ociRuntime": {"name": "crun"}}
        return json.dumps({"host": host, "store": {"graphDriverName": "overlay"}})


async def cli_asks(tmp_path: Path) -> int:
    """How many times two processes' podman CLI backends ran podman for their info."""
    cli = FakeCli()
    for _ in range(2):
        runtime = cli_runtime(Settings(state_dir=tmp_path / "state"))  # podman: first on PATH
        runtime.cli = cli  # type: ignore[assignment]
        info = await runtime.info()
        assert (info.name, info.endpoint, info.reattach) == ("podman-cli", runtime.executable, False)
    return len(cli.asked)


@pytest.mark.usefixtures("fake_podman_on_path")
async def test_the_podman_cli_keeps_its_info(tmp_path: Path) -> None:
    assert await cli_asks(tmp_path) == 2  # --version and info, once


@pytest.mark.usefixtures("fake_podman_on_path")
@pytest.mark.parametrize("variable", ["CONTAINER_HOST", "CONTAINER_CONNECTION"])
async def test_a_podman_cli_of_a_remote_service_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "ssh://core@far.example/run/podman/podman.sock")
    assert await cli_asks(tmp_path) == 4
    assert not cache_dir().exists()


async def test_doctor_asks_the_engine_afresh(machine: Machine, tmp_path: Path) -> None:
    """People run doctor after changing their setup: it drops the kept infos before it asks."""
    from kernelbridge.cli.doctor import Doctor

    kept = machine.store(directory=None)  # the user's cache directory (XDG_CACHE_HOME)
    kept.keep(kept.key(), INFO)
    assert kept.lookup()[1] == INFO
    # An engine that is not there: doctor reports it and opens nothing.
    settings = Settings(
        state_dir=tmp_path / "state", engine=EngineSettings(urls=("unix:///nonexistent/e.sock",))
    )
    lines: list[str] = []
    with anyio.fail_after(30):
        await Doctor(settings, out=lines.append, env={"HOME": str(tmp_path)}).run()
    assert any(line.split()[:2] == ["FAIL", "runtime"] for line in lines), lines
    assert kept.lookup()[1] is None
