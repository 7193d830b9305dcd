"""Property-based fuzzing (hypothesis) of what a hostile sandbox or a confused client controls:
the frame decoder's bytes, the frames the tunnel handles, and run_python's arguments through the
real MCP server. No exception may escape, memory stays bounded, valid input round-trips.
Each test tries a third of its examples by default, all of them with ``--soak`` (tests/scale.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from bridge_harness import ensure_image, local_bridge, open_bridge, status_kib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client.client import Client
from scale import soak_or

from kernelbridge import frames
from kernelbridge.session.recorder import MAX_OPEN_CELLS, Recorder
from kernelbridge.tunnel import Tunnel, TunnelState, memory_channel_pair
from kernelbridge.tunnel.core import MAX_PENDING

MiB = 1024 * 1024

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
valid_frames = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(frames.FRAME_TYPES - {frames.KERNEL}))},
    optional={"message": json_values, "id": st.integers(), "reason": st.text(max_size=100)},
)


@settings(max_examples=soak_or(500, 1500), deadline=None)
@given(
    valid=st.lists(valid_frames, max_size=10),
    junk=st.lists(st.binary(max_size=300), max_size=10),
    cuts=st.lists(st.integers(0, 5000), max_size=20),
)
def test_the_decoder_never_raises_and_round_trips(
    valid: list[Any], junk: list[bytes], cuts: list[int]
) -> None:
    # Valid frames, each followed by a junk line (junk never holds a newline itself), cut anywhere.
    stream = b"".join(
        frames.encode(f) + j.replace(b"\n", b"") + b"\n"
        for f, j in zip(valid, junk + [b""] * len(valid), strict=False)
    )
    decoder = frames.FrameDecoder(max_frame_bytes=4096)
    results: list[Any] = []
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        results += decoder.feed(stream[start:cut])
        start = max(start, cut)
        assert decoder.pending_bytes <= len(stream)
    got = [r for r in results if isinstance(r, dict)]
    assert all(isinstance(r, dict | frames.FrameError) for r in results)
    assert [f for f in got if f in valid] == [f for f in valid if len(frames.encode(f)) <= 4096]


@settings(max_examples=soak_or(500, 1500), deadline=None)
@given(st.binary(max_size=2000), st.integers(1, 64))
def test_arbitrary_bytes_in_arbitrary_chunks(data: bytes, step: int) -> None:
    decoder = frames.FrameDecoder(max_frame_bytes=512)
    for i in range(0, len(data), step):
        for item in decoder.feed(data[i : i + step]):
            assert isinstance(item, dict | frames.FrameError)
            if isinstance(item, dict):
                assert item["type"] in frames.FRAME_TYPES
        assert decoder.pending_bytes <= 512 + step


@settings(max_examples=soak_or(170, 500), deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=10))
def test_from_wire_raises_only_value_error(parts: list[bytes]) -> None:
    try:
        frames.from_wire([*parts[:2], frames.DELIM, *parts[2:]])
    except ValueError:
        pass


headers = st.fixed_dictionaries(
    {},
    optional={
        "msg_id": st.text(max_size=8) | st.integers(),
        "msg_type": st.sampled_from(
            [
                "status",
                "stream",
                "display_data",
                "execute_result",
                "error",
                "execute_input",
                "clear_output",
                "execute_reply",
                "input_request",
            ]
        )
        | json_values,
        "session": json_values,
    },
)
contents = st.fixed_dictionaries(
    {},
    optional={
        "execution_state": st.sampled_from(["busy", "idle"]) | json_values,
        "text": json_values,
        "name": json_values,
        "data": st.dictionaries(st.text(max_size=12), json_values, max_size=3) | json_values,
        "metadata": json_values,
        "traceback": json_values,
        "ename": json_values,
        "evalue": json_values,
        "execution_count": json_values,
        "status": json_values,
    },
)
messages = st.fixed_dictionaries(
    {"header": headers | json_values},
    optional={
        "parent_header": headers | json_values,
        "content": contents | json_values,
        "metadata": json_values,
    },
)
tunnel_frames = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just(frames.KERNEL),
            "channel": st.sampled_from(sorted(frames.CHANNELS)),
            "msg": messages,
        },
        optional={"buffers": st.lists(st.text(max_size=12), max_size=2) | json_values},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(sorted(frames.FRAME_TYPES))},
        optional={
            "versions": json_values,
            "status": json_values,
            "kind": json_values,
            "reason": json_values,
            "level": json_values,
            "message": json_values,
            "id": json_values,
            "agent_hash": json_values,
        },
    ),
)


class _NullStream(anyio.abc.ByteStream):
    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.sleep_forever()
        return b""

    async def send(self, item: bytes) -> None:
        return None

    async def send_eof(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


@settings(max_examples=soak_or(80, 250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tunnel_frames, min_size=1, max_size=30))
def test_the_tunnel_handles_any_frame(batch: list[dict[str, Any]]) -> None:
    recorder = Recorder(200)
    reached_owner: list[str] = []

    async def peer(channel: str, msg: dict[str, Any], buffers: list[bytes]) -> None:
        # What the bridge's Sandbox does with each message (see host/client.py).
        if channel == "iopub":
            await recorder.on_iopub(msg)
        else:
            recorder.on_reply(msg)

    async def main() -> None:
        owner, tunnel_end = memory_channel_pair()
        tunnel = Tunnel(_NullStream(), tunnel_end, connection=None, session="fuzz", kernel_key="k", peer=peer)
        recorder.expect("ours", "x")

        async def drain() -> None:
            while True:
                reached_owner.append((await owner.receive()).TYPE)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await tunnel.handle({"type": frames.READY, "versions": {}})  # the kernel is up
            await anyio.wait_all_tasks_blocked()
            assert tunnel.state is TunnelState.READY and reached_owner == [frames.READY]
            reached_owner.clear()
            for frame in batch:
                parsed = frames.parse_line(frames.encode(frame)[:-1])  # through the decoder's checks
                if isinstance(parsed, dict):
                    await tunnel.handle(parsed)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert len(tunnel.pending) <= MAX_PENDING
        assert set(reached_owner) <= {frames.RPC_REQUEST, frames.FS_RESPONSE}  # never ready once READY
        assert len([c for c in recorder.cells.values() if c.source != "mcp"]) <= MAX_OPEN_CELLS
        assert "ours" in recorder.cells  # the bridge's own cell is never pushed out

    anyio.run(main)


run_python_args = st.fixed_dictionaries(
    {},
    optional={
        "code": st.sampled_from(
            ["1 + 1", "print('x')", "x = 1", "raise ValueError('v')", "", " ", "import os"]
        )
        | st.text(max_size=200)
        | json_values,
        "session": st.sampled_from(["fuzz", "fuzz-2"]) | st.text(max_size=70) | json_values,
        "servers": st.lists(st.text(max_size=10), max_size=2) | json_values,
        "timeout": st.integers(-5, 5) | st.sampled_from([10**9, 2.5, "3"]) | json_values,
        "extra": json_values,
    },
)


class Server:
    """An MCP client in a blocking portal: hypothesis' synchronous examples call it one by one."""

    def __init__(self, portal: BlockingPortal, client: Client, pid: int) -> None:
        self.portal, self.client, self.pid = portal, client, pid

    def run_python(self, args: dict[str, Any]) -> Any:
        async def call() -> Any:
            with anyio.fail_after(120):
                return await self.client.call_tool("run_python", args)

        return self.portal.call(call)


@contextlib.contextmanager
def served(opened: Any, pid_of: Any, client_of: Any = lambda client: client) -> Iterator[Server]:
    with start_blocking_portal("asyncio") as portal, portal.wrap_async_context_manager(opened) as value:
        yield Server(portal, client_of(value), pid_of(value))


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = tmp_path_factory.mktemp("fuzz") / "state"
    with served(local_bridge(state, KERNELBRIDGE_MAX_SESSIONS="4"), lambda client: os.getpid()) as server:
        yield server


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = tmp_path_factory.mktemp("fuzz-real") / "state"
    ensure_image()
    with served(open_bridge(state), lambda bridge: bridge.pid, lambda bridge: bridge.client) as server:
        yield server


def keep_fast(args: dict[str, Any], sessions: tuple[str, ...] | None = None) -> dict[str, Any]:
    if isinstance(args.get("timeout"), int) and args["timeout"] > 5:
        args["timeout"] = 5  # a valid long timeout would only make the fuzz slow
    if sessions and isinstance(args.get("session"), str) and args["session"] not in sessions:
        args["session"] = sessions[0]
    return args


LOCAL_START_RSS: list[int] = []


@settings(max_examples=soak_or(400, 1200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=run_python_args)
def test_run_python_arguments_through_the_server(local_server: Server, args: dict[str, Any]) -> None:
    """The real server on the local test-double runtime: every argument set gets an answer."""
    if not LOCAL_START_RSS:
        LOCAL_START_RSS.append(status_kib(os.getpid(), "VmRSS"))
    result = local_server.run_python(keep_fast(args))
    assert result.content, args
    assert status_kib(os.getpid(), "VmRSS") - LOCAL_START_RSS[0] < 400 * 1024


REAL_START_RSS: list[int] = []


@pytest.mark.podman
@settings(max_examples=soak_or(50, 150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=run_python_args)
def test_run_python_arguments_through_a_real_sandbox(real_server: Server, args: dict[str, Any]) -> None:
    if not REAL_START_RSS:
        REAL_START_RSS.append(status_kib(real_server.pid, "VmRSS"))
    result = real_server.run_python(keep_fast(args, ("fuzz", "fuzz-2")))
    assert result.content, args
    assert status_kib(real_server.pid, "VmRSS") - REAL_START_RSS[0] < 200 * 1024
