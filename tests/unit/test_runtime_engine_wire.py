"""The engine backend's pure parts: the attach stream codec, the stderr tail, the create body."""

from __future__ import annotations

import random

import pytest

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.engine.body import create_body
from kernelbridge.runtime.engine.stream import HEADER, STDERR, STDOUT, FrameDemux, StderrTail
from kernelbridge.runtime.flags import READ_ONLY_TMPFS, size_bytes


def frame(stream: int, payload: bytes) -> bytes:
    return HEADER.pack(stream, len(payload)) + payload


def test_demux_survives_any_split() -> None:
    frames = [(STDOUT, b"hello"), (STDERR, b"oops\n"), (STDOUT, b""), (STDOUT, b"x" * 70000), (STDERR, b"!")]
    wire = b"".join(frame(s, p) for s, p in frames)
    rng = random.Random(7)
    for _ in range(50):
        demux = FrameDemux()
        got: dict[int, bytes] = {STDOUT: b"", STDERR: b""}
        at = 0
        while at < len(wire):
            step = rng.choice([1, 3, 7, 8, 9, 4096, 100000])
            for stream, piece in demux.feed(wire[at : at + step]):
                got[stream] += piece
            at += step
        assert got == {STDOUT: b"hello" + b"x" * 70000, STDERR: b"oops\n!"}
        assert not demux.mid_frame


def test_demux_reports_a_truncated_frame() -> None:
    demux = FrameDemux()
    assert list(demux.feed(frame(STDOUT, b"abcdef")[:-2])) == [(STDOUT, b"abcd")]
    assert demux.mid_frame


def test_stderr_tail_is_bounded() -> None:
    tail = StderrTail(lines=3, chars=10)
    tail.feed(b"one\ntwo\nthr")
    tail.feed(b"ee\nfour\n" + b"y" * 10_000)
    tail.feed(b"z" * 10_000)
    assert tail.lines() == ["three", "four", "y" * 10]
    tail.feed(b"\n\xff\xfebad bytes\r\n")
    assert tail.lines()[-1] == "\ufffd\ufffdbad byte"[:10]


def test_size_bytes() -> None:
    assert size_bytes("512m") == 512 * 1024**2
    assert size_bytes("1G") == 1024**3
    assert size_bytes("1.5k") == 1536
    assert size_bytes("100") == 100
    with pytest.raises(ValueError):
        size_bytes("lots")


def test_create_body_carries_every_sandbox_flag() -> None:
    spec = ContainerSpec(
        image="img:1",
        name="kb-x",
        session="s1",
        owner_pid=42,
        owner_host="h",
        env=(("A", "1"),),
        command=("python3", "-V"),
        labels=(("extra", "yes"),),
    )
    body = create_body(spec)
    host = body["HostConfig"]
    assert body["Image"] == "img:1" and body["Cmd"] == ["python3", "-V"] and body["Env"] == ["A=1"]
    assert body["Labels"] == {
        "kernelbridge.session": "s1",
        "kernelbridge.owner": "42",
        "kernelbridge.host": "h",
        "kernelbridge.shape": spec.shape,
        "kernelbridge.mounts": spec.mounts_shape,
        "extra": "yes",
    }
    assert body["User"] == "65534:65534" and body["WorkingDir"] == "/workspace"
    assert body["OpenStdin"] and body["StdinOnce"] and not body["Tty"]
    assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["ReadonlyRootfs"] is True
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
    assert host["PidsLimit"] == 128 and host["NanoCpus"] == 1_000_000_000
    assert host["Tmpfs"] == {
        "/tmp": "rw,size=64m,mode=1777,nosuid,nodev",
        "/workspace": "rw,size=256m,mode=1777,nosuid,nodev",
        "/packages": "rw,size=192m,mode=1777,nosuid,nodev",
        # Read-only and empty: podman's read-only root would put unsized writable tmpfs there.
        "/var/tmp": READ_ONLY_TMPFS,
        "/run": READ_ONLY_TMPFS,
    }
    assert host["Binds"] == []
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
        "nofile": (1024, 1024),
        "nproc": (4096, 4096),
    }
    # The differences from `run --rm --init`: PID 1 is the agent, and the container outlives its
    # exit until removed (so its exit code and OOM flag can be inspected).
    assert host["Init"] is False and host["AutoRemove"] is False
    assert host["LogConfig"]["Type"] == "none"


def test_create_body_follows_the_limits() -> None:
    limits = SandboxLimits(memory="1g", pids=32, cpus=0.25, read_only=False, network="none")
    spec = ContainerSpec(image="i", name="n", session="s", owner_pid=1, limits=limits)
    body = create_body(spec)
    assert "Cmd" not in body, "no command: the image's CMD (the agent) runs"
    host = body["HostConfig"]
    assert host["Memory"] == 1024**3 and host["PidsLimit"] == 32 and host["NanoCpus"] == 250_000_000
    assert host["ReadonlyRootfs"] is False
