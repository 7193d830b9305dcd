"""The host's typed pieces without any sandbox: the sandbox state machine, the control channel's
typed messages (and their one decoding from frames), exit kinds <-> exceptions, rate-limited logs."""

from __future__ import annotations

import logging
import socket

import anyio
import pytest

from kernelbridge import frames
from kernelbridge.errors import (
    AgentMismatch,
    ExitKind,
    IllegalTransition,
    ImageError,
    KernelDied,
    LimitsNotEnforced,
    RuntimeUnavailable,
    SandboxStartFailed,
    SandboxStartTimeout,
    exit_of,
    start_error,
)
from kernelbridge.host.state import Change, SandboxState, next_state
from kernelbridge.ratelimit import RateLimitedLog
from kernelbridge.tunnel import SocketControlChannel
from kernelbridge.tunnel import events as ev

S, C = SandboxState, Change


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the state machine ------------------------------------------------------------------------------


def test_a_sandbox_lives_through_start_restart_and_death() -> None:
    state = S.STARTING
    for change, expected in [
        (C.READY, S.READY),
        (C.RESTART, S.RESTARTING),
        (C.READY, S.READY),
        (C.END, S.DEAD),
    ]:
        state = next_state(state, change)
        assert state is expected


def test_a_ready_arriving_mid_close_leaves_it_closing_and_the_end_is_a_close() -> None:
    state = next_state(next_state(S.READY, C.RESTART), C.CLOSE)
    assert state is S.CLOSING
    assert next_state(state, C.READY) is S.CLOSING  # the restart's answer, racing the close
    assert next_state(state, C.END) is S.CLOSED  # not DEAD: nobody records a death


@pytest.mark.parametrize("state", [S.STARTING, S.READY, S.RESTARTING, S.CLOSING])
def test_close_is_legal_from_every_live_state(state: SandboxState) -> None:
    assert next_state(state, C.CLOSE) is S.CLOSING


@pytest.mark.parametrize("state", [S.DEAD, S.CLOSED])
def test_closing_what_ended_changes_nothing(state: SandboxState) -> None:
    assert next_state(state, C.CLOSE) is state


@pytest.mark.parametrize(
    ("state", "change"),
    [
        (S.READY, C.READY),  # the tunnel drops a ready nobody asked for
        (S.STARTING, C.RESTART),
        (S.CLOSING, C.RESTART),
        (S.DEAD, C.READY),  # nothing comes after the tunnel's end
        (S.CLOSED, C.READY),
        (S.DEAD, C.END),
        (S.CLOSED, C.RESTART),
    ],
)
def test_illegal_transitions_raise(state: SandboxState, change: Change) -> None:
    with pytest.raises(IllegalTransition, match=state.value):
        next_state(state, change)


def test_only_starting_ready_and_restarting_are_alive() -> None:
    assert {s for s in S if s.alive} == {S.STARTING, S.READY, S.RESTARTING}


# -- typed control messages ------------------------------------------------------------------------

MESSAGES = [
    ev.Ready({"python": "3.13"}, "abc"),
    ev.Exited(-9, ExitKind.OOM, "killed"),
    ev.Exited(None, ExitKind.CONTAINER_EXITED, "gone"),
    ev.RpcRequest(7, "call_tool", {"server": "s"}, "cell-1"),
    ev.FsResponse(3, {"entries": []}),
    ev.FsResponse(4, None, {"kind": "not_found", "message": "no such file"}),
    ev.Interrupt(),
    ev.Restart(),
    ev.Shutdown(),
    ev.RpcResponse(7, result={"ok": True}),
    ev.RpcResponse(8, error={"kind": "busy", "message": "later"}),
    ev.FsRequest(5, "write", "a.txt", "eA=="),
    ev.Launch("/c.json", None, {"name": "n"}, {"memory": "512m"}, "podman", {}, "/s", 30.0, False),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_the_frame_codec(message: object) -> None:
    frame = message.to_frame()  # type: ignore[attr-defined]
    line = frames.encode(frame)
    parsed = frames.parse_line(line[:-1])
    assert isinstance(parsed, dict) and ev.from_frame(parsed) == message


def test_untrusted_exit_and_ready_fields_are_typed_and_clipped() -> None:
    exited = ev.Exited.from_frame({"type": "exit", "status": True, "kind": "evil", "reason": ["r" * 5000]})
    assert exited.status is None and exited.kind is ExitKind.KERNEL_DIED and len(exited.reason) < 600
    ready = ev.Ready.from_frame({"type": "ready", "versions": {f"k{i}": "v" * 500 for i in range(50)}})
    assert len(ready.versions) == 20 and all(len(v) < 120 for v in ready.versions.values())
    assert ev.Ready.from_frame({"type": "ready", "versions": "not a dict"}).versions == {}
    refused = ev.FsResponse.from_frame({"type": "fs_response", "id": 1, "error": {"kind": "k" * 100}})
    assert refused.error is not None and len(refused.error["kind"]) < 80


def test_frames_that_are_not_control_messages_decode_to_none() -> None:
    assert ev.from_frame({"type": frames.KERNEL, "channel": "iopub", "msg": {"header": {}}}) is None
    assert ev.from_frame({"type": frames.LOG, "message": "x"}) is None
    assert ev.from_frame({"type": frames.LAUNCH, "connection_file": 5}) is None


@pytest.mark.anyio
async def test_a_socket_channel_carries_typed_messages_and_drops_the_rest() -> None:
    a, b = socket.socketpair()
    left, right = SocketControlChannel(a), SocketControlChannel(b)
    try:
        with anyio.fail_after(5):
            await left.send(ev.Restart())
            a.sendall(b"not json\n" + frames.encode({"type": frames.LOG, "message": "x"}))
            await left.send(ev.Exited(0, ExitKind.SHUTDOWN, "asked"))
            assert await right.receive() == ev.Restart()
            assert await right.receive() == ev.Exited(0, ExitKind.SHUTDOWN, "asked")
            assert right.dropped == 2
            await left.aclose()
            with pytest.raises(anyio.EndOfStream):
                await right.receive()
    finally:
        await right.aclose()


# -- exit kinds <-> exceptions ---------------------------------------------------------------------


def test_exit_kinds_are_the_wire_strings() -> None:
    wire = {value for name, value in vars(frames).items() if name.startswith("EXIT_")}
    assert {kind.value for kind in ExitKind} == wire
    assert ExitKind.from_wire("no such kind") is ExitKind.KERNEL_DIED


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        (ExitKind.AGENT_MISMATCH, AgentMismatch, "stale"),
        (ExitKind.IMAGE_MISSING, ImageError, "stale"),
        (ExitKind.KERNEL_DIED, KernelDied, "stale"),
        (ExitKind.OOM, KernelDied, "the kernel ran out of memory while starting (stale)"),
        (ExitKind.START_TIMEOUT, SandboxStartTimeout, "stale"),
        (ExitKind.START_FAILED, SandboxStartFailed, "the sandbox failed to start: stale"),
        (ExitKind.PROTOCOL, SandboxStartFailed, "the sandbox failed to start: stale"),
        (None, SandboxStartFailed, "the sandbox failed to start: stale"),
    ],
)
def test_start_errors_by_kind_and_back(kind: ExitKind | None, error: type[Exception], message: str) -> None:
    exc = start_error(kind, "stale")
    assert type(exc) is error and str(exc) == message
    # What a tunnel process tells its provisioner makes the same error there.
    again = start_error(*exit_of(exc))
    assert type(again) is error and str(again) == message


def test_a_container_that_said_nothing_is_explained_by_its_stderr() -> None:
    exc = start_error(ExitKind.CONTAINER_EXITED, "stdout closed", detail="crun: cgroup error")
    assert str(exc) == "the sandbox failed to start: crun: cgroup error"
    assert "ran out of memory" in str(start_error(ExitKind.CONTAINER_EXITED, oom=True))


@pytest.mark.parametrize("exc", [RuntimeUnavailable("no podman"), LimitsNotEnforced("refused"), OSError("x")])
def test_failures_before_any_sandbox_are_start_failures(exc: Exception) -> None:
    kind, reason = exit_of(exc)
    assert kind is ExitKind.START_FAILED and str(start_error(kind, reason)).endswith(str(exc))


# -- rate-limited logs -----------------------------------------------------------------------------


def test_a_flood_of_lines_is_cut_to_the_burst_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = RateLimitedLog(
        logging.getLogger("t"), "%d suppressed", burst=3, window=10, clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, "t"):
        logged = [limited.log(logging.WARNING, "line %d", i) for i in range(100)]
        assert logged.count(True) == 3 and limited.suppressed == 97
        now[0] = 11.0  # a new window: the count is said once, and lines pass again
        assert limited.log(logging.WARNING, "after")
    assert [r.getMessage() for r in caplog.records] == [
        "line 0",
        "line 1",
        "line 2",
        "97 suppressed",
        "after",
    ]
