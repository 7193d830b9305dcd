"""Remote engines for real: engines in a network namespace of our own, reached over tcp.

The namespace is joined to the host by a veth pair on a /30 of 198.18.0.0/15 (benchmarking
space: nothing else lives there); a podman service listens on plain tcp and a dockerd on tcp with
TLS (certificates made here with openssl, mutual authentication as ``DOCKER_TLS_VERIFY`` does).
The backends are picked by ``open_runtime`` from ``CONTAINER_HOST`` / ``DOCKER_HOST`` as a user
would set them. Everything (processes, veth, namespace) is torn down afterwards.
"""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from runtime_harness import (
    NetNs,
    make_spec,
    make_tls,
    network_namespace,
    remove_private_podman,
    start_dockerd,
    start_private_podman,
    start_sshd,
    tiny_rootfs,
)

from kernelbridge.config import EngineSettings, Settings
from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime import ContainerState, open_runtime, open_selection

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.slow]

STEP = 60.0
TINY = "localhost/kernelbridge-test-tiny:remote"
TLS_DOCKER_DIR = Path("/run/kbtest-docker-tls")
"""The TLS dockerd's roots: short (containerd's socket path under the exec root must fit
sun_path) and apart from the local test dockerd's."""


def client_context(tls: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    ctx.load_cert_chain(str(tls / "cert.pem"), str(tls / "key.pem"))
    return ctx


@pytest.fixture(scope="module")
def netns() -> Iterator[NetNs]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2")
    with network_namespace("kbr") as ns:
        yield ns


async def round_trip(backend: object) -> None:
    """create -> attach -> echo -> EOF -> exited 0 -> remove -> gone, on a remote engine."""
    spec = make_spec(TINY, ("cat",))
    container = await backend.create(spec)  # type: ignore[attr-defined]
    stream = await backend.attach(container)  # type: ignore[attr-defined]
    payload = os.urandom(1 << 20)
    async with anyio.create_task_group() as tg:

        async def feed() -> None:
            await stream.send(payload)
            await stream.send_eof()

        tg.start_soon(feed)
        got = b""
        try:
            while True:
                got += await stream.receive()
        except anyio.EndOfStream:
            pass
    assert got == payload
    await stream.aclose()
    info = await backend.inspect(container)  # type: ignore[attr-defined]
    for _ in range(int(STEP / 0.05)):
        if info.state is ContainerState.EXITED:
            break
        await anyio.sleep(0.05)
        info = await backend.inspect(container)  # type: ignore[attr-defined]
    assert info.exit_code == 0
    await backend.remove([container])  # type: ignore[attr-defined]
    assert await backend.inspect(container) is None  # type: ignore[attr-defined]


async def test_podman_service_over_tcp(netns: NetNs, tmp_path: Path) -> None:
    url = f"tcp://{netns.ns_ip}:8080"
    directory = Path(tempfile.mkdtemp(prefix="kbrp-"))
    service = start_private_podman(directory, netns=netns.name, url=url)
    try:
        settings = Settings(
            state_dir=tmp_path / "state", runtime="podman-api", engine=EngineSettings(container_host=url)
        )
        with anyio.fail_after(STEP):
            async with open_selection(settings) as selected:
                assert selected.reason == f"podman API at {url} (CONTAINER_HOST)"
                backend = selected.backend
                await backend.images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), TINY, ['CMD ["cat"]'])
                await round_trip(backend)
                assert await backend.images.remove(TINY)
    finally:
        service.stop()
        remove_private_podman(directory)


async def test_dockerd_over_tls(netns: NetNs, tmp_path: Path) -> None:
    if shutil.which("dockerd") is None:
        pytest.skip("dockerd is not installed (scripts/setup.sh installs docker.io)")
    tls = make_tls(tmp_path / "tls", netns.ns_ip)
    url = f"tcp://{netns.ns_ip}:2376"
    daemon = start_dockerd(
        TLS_DOCKER_DIR,
        [url],
        netns=netns.name,
        tls=tls,
        probe=f"https://{netns.ns_ip}:2376",
        verify=client_context(tls),
    )
    try:
        engine = EngineSettings(docker_host=url, tls_verify=True, cert_path=tls)
        settings = Settings(state_dir=tmp_path / "state", runtime="docker-api", engine=engine)
        with anyio.fail_after(STEP * 2):
            async with open_selection(settings) as selected:
                assert selected.reason == f"docker API at https://{netns.ns_ip}:2376 (DOCKER_HOST)"
                backend = selected.backend
                await backend.images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), TINY, ['CMD ["cat"]'])
                await round_trip(backend)
                assert await backend.images.remove(TINY)
            # Without our client certificate the engine refuses the handshake.
            (tmp_path / "nocert").mkdir()
            shutil.copy(tls / "ca.pem", tmp_path / "nocert" / "ca.pem")
            no_cert = Settings(
                state_dir=tmp_path / "state",
                runtime="docker-api",
                engine=EngineSettings(docker_host=url, tls_verify=True, cert_path=tmp_path / "nocert"),
            )
            with pytest.raises(RuntimeUnavailable, match=rf"docker engine at https://{netns.ns_ip}:2376"):
                async with open_runtime(no_cert):
                    pass
            # And we refuse an engine whose certificate our CA did not sign.
            other = make_tls(tmp_path / "other", netns.ns_ip)
            wrong_ca = Settings(
                state_dir=tmp_path / "state",
                runtime="docker-api",
                engine=EngineSettings(docker_host=url, tls_verify=True, cert_path=other),
            )
            with pytest.raises(RuntimeUnavailable, match="certificate verify failed"):
                async with open_runtime(wrong_ca):
                    pass
    finally:
        daemon.stop()


def ssh_processes(sock_dir: str) -> list[int]:
    """Our ssh forwards: ssh processes whose command line names a socket under ``sock_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ssh") and any(sock_dir.encode() in a for a in argv):
            found.append(int(entry.name))
    return found


async def test_podman_service_over_ssh(netns: NetNs, tmp_path: Path) -> None:
    if not await anyio.Path("/usr/sbin/sshd").exists():
        pytest.skip("sshd is not installed (openssh-server)")
    keys = Path(tempfile.mkdtemp(prefix="kbssh-"))
    podman_dir = Path(tempfile.mkdtemp(prefix="kbsp-"))
    sshd = start_sshd(keys, netns.ns_ip, netns.name)
    # The engine listens on a unix socket "on the remote machine" (here: the same file system,
    # reached only through sshd in the namespace).
    service = start_private_podman(podman_dir)
    try:
        url = f"ssh://root@{netns.ns_ip}{podman_dir}/p.sock"
        ssh = ("ssh", "-i", str(keys / "client_key"), "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR")  # fmt: skip
        engine = EngineSettings(container_host=url, ssh_command=ssh)
        run_dir = tmp_path / "state" / "run"
        settings = Settings(state_dir=tmp_path / "state", runtime="podman-api", engine=engine)
        with anyio.fail_after(STEP):
            async with open_selection(settings) as selected:
                assert (
                    selected.reason
                    == f"podman API at ssh://root@{netns.ns_ip}:22{podman_dir}/p.sock (CONTAINER_HOST)"
                )
                backend = selected.backend
                await backend.images.import_rootfs(tiny_rootfs(tmp_path / "tiny.tar"), TINY, ['CMD ["cat"]'])
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(round_trip, backend)
                # One forward per engine, whatever the number of sandboxes and calls.
                assert len(ssh_processes(str(run_dir))) == 1
                assert await backend.images.remove(TINY)
        assert ssh_processes(str(run_dir)) == [], "closing the runtime stops its ssh forward"
        assert not list(run_dir.glob("ssh-*.sock"))
    finally:
        service.stop()
        sshd.stop()
        remove_private_podman(podman_dir)
        shutil.rmtree(keys, ignore_errors=True)
