"""The engine client's failures, against real sockets: nothing listening, and a wedged engine
(a listener that accepts and never answers). Every call ends within its bound, in one line."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpcore2
import pytest

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.engine.endpoint import Endpoint
from kernelbridge.runtime.engine.transport import EngineClient, EngineNetworkBackend, engine_message

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def wedged_engine() -> AsyncIterator[str]:
    """A unix socket that accepts connections and reads requests but never answers."""
    directory = Path(tempfile.mkdtemp(prefix="kbw-"))
    path = str(directory / "wedged.sock")
    listener = await anyio.create_unix_listener(path)

    async def swallow(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                while await stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, swallow)
        yield path
        tg.cancel_scope.cancel()
    await listener.aclose()
    await anyio.Path(path).unlink(missing_ok=True)
    await anyio.Path(directory).rmdir()


async def test_a_wedged_engine_is_unavailable_within_the_bound(wedged_engine: str) -> None:
    client = EngineClient(Endpoint("unix", path=wedged_engine), engine="docker", timeout=0.5)
    with anyio.fail_after(5):
        with pytest.raises(RuntimeUnavailable) as info:
            await client.request("GET", "/containers/json")
        assert str(info.value) == (
            f"the docker engine at unix://{wedged_engine} did not answer GET /containers/json within 0.5 s"
        )
        with pytest.raises(RuntimeUnavailable, match=r"did not answer to attach to c1 within 0\.5 s"):
            await client.hijack("/containers/c1/attach", {"stream": True}, what="to attach to c1")
    await client.aclose()


async def test_nothing_listening(tmp_path: Path) -> None:
    client = EngineClient(
        Endpoint("unix", path=str(tmp_path / "none.sock")), engine="podman", hint="is the service running?"
    )
    with anyio.fail_after(5), pytest.raises(RuntimeUnavailable) as info:
        await client.request("GET", "/_ping")
    assert str(info.value) == (
        f"cannot reach the podman engine at unix://{tmp_path}/none.sock: no such socket; "
        "is the service running?"
    )
    await client.aclose()


async def test_a_unix_connection_carries_bytes_and_a_failed_one_leaves_no_socket(tmp_path: Path) -> None:
    """The engine's unix sockets are kernelbridge's own (a repr without system calls: asyncio
    formats it each time a read waits); they carry bytes both ways, and a connection that fails
    closes its socket."""
    backend = EngineNetworkBackend()
    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        stream = await backend.connect_unix_socket(str(path))
        peer, _ = listener.accept()
        with peer:
            assert repr(stream.get_extra_info("socket")).startswith("<engine socket fd=")
            await stream.write(b"ping")
            assert peer.recv(4) == b"ping"
            peer.sendall(b"pong")
            assert await stream.read(4) == b"pong"
        await stream.aclose()
    fds = len(os.listdir("/proc/self/fd"))
    failures = []  # kept, with their tracebacks (as a log record or an exception group would)
    for _ in range(20):
        with pytest.raises(httpcore2.ConnectError, match="no such socket") as failure:
            await backend.connect_unix_socket(str(tmp_path / "none.sock"))
        failures.append(failure.value)
    assert len(os.listdir("/proc/self/fd")) == fds


async def test_connection_refused_on_tcp() -> None:
    # A port on loopback that nothing listens on: bind one, close it, connect.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    client = EngineClient(Endpoint("tcp", host="127.0.0.1", port=port), engine="docker")
    with anyio.fail_after(5), pytest.raises(RuntimeUnavailable, match="connection refused"):
        await client.request("GET", "/_ping")
    await client.aclose()


def test_engine_messages_are_one_line() -> None:
    assert engine_message(b'{"message":"No such container: x"}\n') == "No such container: x"
    assert engine_message(b"404 page\nnot found") == "404 page not found"
    assert len(engine_message(b"x" * 10_000)) == 500


def test_query_strings() -> None:
    client = EngineClient(Endpoint("unix", path="/x.sock"), engine="docker")
    url = client.url("/containers/json", {"all": True, "filters": {"label": ["a=b", "c"]}})
    assert url == (
        "http://localhost/v1.41/containers/json?all=1&filters=%7B%22label%22%3A%20%5B%22a%3Db%22%2C%20%22c%22%5D%7D"
    )
    assert client.url("/images/create", {"changes": ['CMD ["x"]', "LABEL a=b"]}).endswith(
        "changes=CMD%20%5B%22x%22%5D&changes=LABEL%20a%3Db"
    )
