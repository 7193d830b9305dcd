"""The bridge's Sandbox against a scripted agent (frames over a socketpair, no container, no
kernel): the races of its life that a real agent only hits by chance, its handlers, its errors.

The script plays the agent's side of the frame protocol: it answers ``hello`` with ``ready`` and
then does what each test tells it, so the order of events is the test's, not the scheduler's.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream

from kernelbridge import frames
from kernelbridge.config import Settings
from kernelbridge.errors import AgentMismatch, ExitKind, SandboxError, SandboxFileError
from kernelbridge.host import AttachedContainer, Sandbox, SandboxHandlers, SandboxState
from kernelbridge.runtime import ContainerStream
from kernelbridge.tunnel import RpcRequest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Stream(ContainerStream):
    """The host's end of the socketpair, as a container's stdio."""

    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.stream.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self.stream.send(item)

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def stderr_tail(self) -> list[str]:
        return ["scripted stderr"]


@dataclass
class Agent:
    """The sandbox's end: what the host sent, and a way to answer."""

    stream: SocketStream
    received: list[frames.Frame] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)
    decoder: frames.FrameDecoder = field(default_factory=frames.FrameDecoder)

    async def send(self, frame: frames.Frame) -> None:
        await self.stream.send(frames.encode(frame))

    async def read(self) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            while True:
                for item in self.decoder.feed(await self.stream.receive()):
                    assert isinstance(item, dict)
                    self.received.append(item)
                    self.changed.set()
                    self.changed = anyio.Event()

    async def got(self, kind: str) -> frames.Frame:
        with anyio.fail_after(10):
            while True:
                for frame in self.received:
                    if frame["type"] == kind:
                        return frame
                await self.changed.wait()

    async def leave(self, kind: ExitKind, reason: str, status: int | None = 0) -> None:
        await self.send({"type": frames.EXIT, "status": status, "kind": kind.value, "reason": reason})
        await self.stream.aclose()


@dataclass
class Scripted:
    """A ContainerSource whose container is the script's socketpair."""

    host: SocketStream
    name: str = "kernelbridge-scripted"

    def open(self) -> AbstractAsyncContextManager[AttachedContainer]:
        @contextlib.asynccontextmanager
        async def opened() -> AsyncIterator[AttachedContainer]:
            stream = _Stream(self.host)
            try:
                yield AttachedContainer("scripted-id", self.name, stream)
            finally:
                await stream.aclose()

        return opened()


Script = Callable[[Agent], Awaitable[None]]


async def ready(agent: Agent) -> None:
    """Answer ``hello`` with ``ready``, then only what the test does."""
    await agent.got(frames.HELLO)
    await agent.send({"type": frames.READY, "versions": {"python": "3"}, "agent_hash": "x"})


async def serve(agent: Agent) -> None:
    """:func:`ready`, and leave when asked to shut down (as the real agent does)."""
    await ready(agent)
    await agent.got(frames.SHUTDOWN)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await agent.leave(ExitKind.SHUTDOWN, "shut down on request")


@contextlib.asynccontextmanager
async def scripted_sandbox(
    tmp_path: Path, script: Script = serve, handlers: SandboxHandlers | None = None
) -> AsyncIterator[tuple[Sandbox, Agent]]:
    """A started Sandbox whose agent is ``script``; closed (bounded) at the end."""
    host_sock, agent_sock = socket.socketpair()
    agent = Agent(await SocketStream.from_socket(agent_sock))
    source = Scripted(await SocketStream.from_socket(host_sock))
    settings = Settings(state_dir=tmp_path, kernel_start_timeout=10)
    sandbox = Sandbox(settings, source, "scripted", agent_hash=None, connection_dir=tmp_path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.read)
        tg.start_soon(script, agent)
        with anyio.fail_after(10):
            await tg.start(partial(sandbox.run, handlers or SandboxHandlers()))
        yield sandbox, agent
        with anyio.fail_after(10):
            await sandbox.close()
        tg.cancel_scope.cancel()


async def test_a_ready_arriving_mid_close_is_not_recorded_as_a_death(tmp_path: Path) -> None:
    """The race of issue 14: a restart is answered (``ready``) only after the close was asked
    for. The close stands: the sandbox ends CLOSED, with no death, and the restart says False."""
    async with scripted_sandbox(tmp_path, ready) as (sandbox, agent), anyio.create_task_group() as tg:
        outcome: list[bool] = []

        async def restart() -> None:
            outcome.append(await sandbox.restart(10))

        tg.start_soon(restart)
        await agent.got(frames.RESTART)
        assert sandbox.state is SandboxState.RESTARTING

        async def answer_late() -> None:
            await agent.got(frames.SHUTDOWN)
            await agent.send({"type": frames.READY, "versions": {}, "agent_hash": "x"})  # the restart's
            await agent.leave(ExitKind.SHUTDOWN, "shut down on request")

        tg.start_soon(answer_late)
        with anyio.fail_after(10):
            await sandbox.close()
        assert sandbox.state is SandboxState.CLOSED and sandbox.death is None
        assert outcome == [False] and not sandbox.alive
        assert repr(sandbox) == "<Sandbox 'scripted' closed>"


async def test_a_sandbox_that_ends_by_itself_is_dead_with_its_kind(tmp_path: Path) -> None:
    ended: list[bool] = []
    handlers = SandboxHandlers(on_end=lambda: ended.append(True))
    async with scripted_sandbox(tmp_path, handlers=handlers) as (sandbox, agent):
        assert repr(sandbox) == "<Sandbox 'scripted' ready>" and sandbox.versions == {"python": "3"}
        await agent.leave(ExitKind.KERNEL_DIED, "the kernel was killed by signal 9", status=-9)
        with anyio.fail_after(10):
            await sandbox.gone.wait()
        assert sandbox.state is SandboxState.DEAD and ended == [True]
        assert sandbox.death is not None and sandbox.death.kind is ExitKind.KERNEL_DIED
        assert sandbox.death.reason == "the kernel was killed by signal 9"
        with pytest.raises(SandboxError, match="not running"):
            await sandbox.kernel.execute("1")


async def test_a_start_failure_raises_its_error_by_kind(tmp_path: Path) -> None:
    """Plainly (not in an ExceptionGroup), and the sandbox is gone afterwards."""

    async def mismatched(agent: Agent) -> None:
        await agent.got(frames.HELLO)
        await agent.leave(ExitKind.AGENT_MISMATCH, "the image carries another agent: rebuild it")

    host_sock, agent_sock = socket.socketpair()
    agent = Agent(await SocketStream.from_socket(agent_sock))
    source = Scripted(await SocketStream.from_socket(host_sock))
    sandbox = Sandbox(
        Settings(state_dir=tmp_path), source, "scripted", agent_hash=None, connection_dir=tmp_path
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.read)
        tg.start_soon(mismatched, agent)
        with anyio.fail_after(10), pytest.raises(AgentMismatch, match="rebuild it"):
            await tg.start(sandbox.run)
    assert sandbox.state is SandboxState.DEAD and sandbox.death is None and sandbox.gone.is_set()
    assert not sandbox.connection_file.exists()


async def test_handlers_passed_to_run_hear_iopub_replies_and_rpc(tmp_path: Path) -> None:
    iopub: list[dict[str, Any]] = []
    replies: list[dict[str, Any]] = []
    requests: list[RpcRequest] = []
    requested = anyio.Event()

    async def on_iopub(msg: dict[str, Any]) -> None:
        iopub.append(msg)

    async def on_rpc(request: RpcRequest) -> None:
        requests.append(request)
        requested.set()

    handlers = SandboxHandlers(on_iopub, replies.append, on_rpc)
    async with scripted_sandbox(tmp_path, handlers=handlers) as (sandbox, agent):
        msg_id = await sandbox.kernel.execute("1+1")
        sent = await agent.got(frames.KERNEL)
        assert sent["msg"]["header"]["msg_id"] == msg_id and sent["msg"]["content"]["allow_stdin"] is False
        parent = sent["msg"]["header"]
        await agent.send(
            frames.kernel_frame("iopub", {"header": {"msg_type": "status"}, "parent_header": parent})
        )
        await agent.send(
            frames.kernel_frame("shell", {"header": {"msg_type": "execute_reply"}, "parent_header": parent})
        )
        await agent.send(
            {"type": frames.RPC_REQUEST, "id": 4, "method": "manifest", "params": {}, "cell": "c"}
        )
        reply = await sandbox.kernel.reply(msg_id, 10)
        assert reply is not None and reply["header"]["msg_type"] == "execute_reply"
        assert [m["header"]["msg_type"] for m in iopub] == ["status"] and len(replies) == 1
        with anyio.fail_after(10):
            await requested.wait()
        assert requests == [RpcRequest(4, "manifest", {}, "c")]
        await sandbox.agent.answer_rpc(4, result={"servers": []})
        assert (await agent.got(frames.RPC_RESPONSE)) == {
            "type": "rpc_response",
            "id": 4,
            "result": {"servers": []},
        }


async def test_without_an_rpc_handler_calls_are_answered_unavailable(tmp_path: Path) -> None:
    async with scripted_sandbox(tmp_path) as (_, agent):
        await agent.send({"type": frames.RPC_REQUEST, "id": 1, "method": "manifest", "params": {}})
        answer = await agent.got(frames.RPC_RESPONSE)
        assert answer["error"] == {"kind": "unavailable", "message": "no host MCP servers in this kernel"}


async def test_a_refused_file_request_raises_with_its_kind(tmp_path: Path) -> None:
    async with scripted_sandbox(tmp_path) as (sandbox, agent), anyio.create_task_group() as tg:

        async def refuse() -> None:
            request = await agent.got(frames.FS_REQUEST)
            assert (request["op"], request["path"]) == ("read", "../x")
            error = {"kind": "invalid_path", "message": "outside /workspace"}
            await agent.send({"type": frames.FS_RESPONSE, "id": request["id"], "error": error})

        tg.start_soon(refuse)
        with pytest.raises(SandboxFileError, match="outside /workspace") as refused:
            await sandbox.agent.files("read", path="../x", timeout=10)
        assert refused.value.kind == "invalid_path"


async def test_the_connection_file_lives_as_long_as_the_sandbox(tmp_path: Path) -> None:
    async with scripted_sandbox(tmp_path) as (sandbox, _):
        assert sandbox.connection_file.stat().st_mode & 0o777 == 0o600
    assert not sandbox.connection_file.exists() and sandbox.state is SandboxState.CLOSED


async def test_cancelled_while_starting_it_releases_its_container(tmp_path: Path) -> None:
    """The owner's task group is cancelled before the agent said ``ready`` (a client gave up):
    ``run`` ends at once, the container source is left (its stream closed) and nothing is a death."""

    async def silent(agent: Agent) -> None:
        await agent.got(frames.HELLO)  # and never ready

    host_sock, agent_sock = socket.socketpair()
    agent = Agent(await SocketStream.from_socket(agent_sock))
    source = Scripted(await SocketStream.from_socket(host_sock))
    sandbox = Sandbox(
        Settings(state_dir=tmp_path), source, "scripted", agent_hash=None, connection_dir=tmp_path
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.read)
            tg.start_soon(silent, agent)
            tg.start_soon(sandbox.run)
            await agent.got(frames.HELLO)
            assert sandbox.state is SandboxState.STARTING
            tg.cancel_scope.cancel()
    assert sandbox.gone.is_set() and sandbox.state is SandboxState.DEAD and sandbox.death is None
    assert not sandbox.connection_file.exists()
    with pytest.raises(anyio.ClosedResourceError):
        await source.host.send(b"x")  # released: the stream was closed
