"""The adoption handshake of a sandbox that outlived its bridge (issue 15), both ends, and what a
detached agent keeps.

- the host's side (``Sandbox`` adopting, its tunnel's handshake) against scripted sandboxes:
  garbage, a refusal, a wrong proof each end in one ``AdoptionFailed`` line within a bound; a true
  answer adopts, with its facts decoded and bounded (they come from the sandbox);
- the agent's side (``Candidate``) against scripted hosts over real pipes: garbage, another frame,
  a wrong or missing proof are rejected, the secret's proof accepted;
- the ``Outbox`` while detached: what a host did not acknowledge is sent again, the oldest output
  dropped first past the buffer, counted;
- a journal whose last line a SIGKILL tore is resumed: the torn line closed, the cells counted.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from test_host_sandbox import Agent, Scripted

from kernelbridge import frames
from kernelbridge.config import Settings
from kernelbridge.errors import AdoptionFailed
from kernelbridge.host import Sandbox, SandboxHandlers
from kernelbridge.inside.agent import outbox
from kernelbridge.inside.agent.adoption import Accepted, Candidate, Handover, Rejected
from kernelbridge.inside.agent.outbox import Kind, Outbox
from kernelbridge.notebook.journal import Journal
from kernelbridge.tunnel import Durability

pytestmark = pytest.mark.anyio
SECRET = "5e" * 32
BOUND = 10.0


async def adopt(tmp_path: Path, script: Callable[[Agent], Awaitable[None]]) -> Sandbox:
    """An adopting Sandbox whose "container" is ``script``, started; closed by the caller."""
    host_sock, agent_sock = socket.socketpair()
    agent = Agent(await SocketStream.from_socket(agent_sock))
    source = Scripted(await SocketStream.from_socket(host_sock))
    sandbox = Sandbox(
        Settings(state_dir=tmp_path, kernel_start_timeout=2),
        source,
        "scripted",
        agent_hash=None,
        connection_dir=tmp_path,
        durability=Durability(SECRET, 60.0, 1 << 20, adopting=True),
    )
    failure: AdoptionFailed | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.read)
        tg.start_soon(script, agent)
        try:
            with anyio.fail_after(BOUND):
                await tg.start(sandbox.run, SandboxHandlers())
        except AdoptionFailed as exc:
            failure = exc
        else:
            await sandbox.close()
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return sandbox


def proof_for(nonce: str, host_nonce: str, frame: frames.Frame, secret: str = SECRET) -> str:
    return frames.adoption_proof(secret, frames.AGENT_ROLE, nonce, host_nonce, frame)


NONCE = "ab" * 32


async def fails_with(tmp_path: Path, script: Callable[[Agent], Awaitable[None]], reason: str) -> None:
    with pytest.raises(AdoptionFailed) as caught:
        await adopt(tmp_path, script)
    said = str(caught.value)
    assert reason in said and "\n" not in said, said


async def test_garbage_instead_of_a_challenge_fails_in_one_line(tmp_path: Path) -> None:
    async def garbage(agent: Agent) -> None:
        await agent.stream.send(b"\x00\xffnot a frame at all\n" * 3)

    await fails_with(tmp_path, garbage, "could not be adopted")


async def test_a_challenge_without_a_nonce_is_garbage(tmp_path: Path) -> None:
    async def no_nonce(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": 7})

    await fails_with(tmp_path, no_nonce, "garbage")


async def test_a_refusal_is_said(tmp_path: Path) -> None:
    async def refuse(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": NONCE})
        await agent.got(frames.HELLO)
        await agent.send({"type": frames.REFUSED, "reason": "another bridge is attached to this sandbox"})

    await fails_with(tmp_path, refuse, "another bridge is attached")


async def test_a_sandbox_that_cannot_prove_the_secret_is_not_adopted(tmp_path: Path) -> None:
    async def impostor(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": NONCE})
        hello = await agent.got(frames.HELLO)
        answer = {"type": frames.ADOPTED, "next": 1}
        await agent.send({**answer, "proof": proof_for(NONCE, hello["nonce"], answer, secret="00" * 32)})

    await fails_with(tmp_path, impostor, "not the one this session made")


async def test_a_silent_sandbox_fails_within_the_bound(tmp_path: Path) -> None:
    async def silent(agent: Agent) -> None:
        await anyio.sleep_forever()

    await fails_with(tmp_path, silent, "did not answer")


async def test_the_true_sandbox_is_adopted_and_its_facts_are_bounded(tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    async def true(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": NONCE})
        hello = await agent.got(frames.HELLO)
        seen["proof_ok"] = frames.proof_matches(
            frames.adoption_proof(SECRET, frames.HOST_ROLE, NONCE, hello["nonce"], hello), hello.get("proof")
        )
        answer = {
            "type": frames.ADOPTED,
            "next": 5,
            "dropped": {"frames": 3, "bytes": -1},
            "detached": 12.5,
            "how": "rm -rf /",
            "cells": [{"msg_id": "m" * 500, "code": "x" * 100_000, "status": "weird"}, "junk"] * 20,
            "versions": {"python": "3.11"},
        }
        await agent.send({**answer, "proof": proof_for(NONCE, hello["nonce"], answer)})
        await agent.got(frames.SHUTDOWN)

    sandbox = await adopt(tmp_path, true)
    assert seen == {"proof_ok": True}  # the bridge proved it knows the secret
    adoption = sandbox.adoption
    assert adoption is not None and adoption.next == 5 and adoption.detached == 12.5
    assert (adoption.dropped_frames, adoption.dropped_bytes, adoption.how) == (3, 0, None)
    assert len(adoption.cells) == 8 and {c.status for c in adoption.cells} == {"running"}  # 16 read
    assert max(len(c.msg_id) for c in adoption.cells) <= 250  # clipped, with its marker
    assert max(len(c.code) for c in adoption.cells) <= 16 * 1024


# -- the agent's side -------------------------------------------------------------------------------
class Host:
    """A candidate host on real pipes, as the handover passes them to the agent."""

    def __init__(self) -> None:
        to_agent_r, self.to_agent = os.pipe()
        self.from_agent, from_agent_w = os.pipe()
        a, b = socket.socketpair()
        self.peer = b
        for fd in (to_agent_r, from_agent_w):
            os.set_blocking(fd, False)
        self.candidate = Candidate(Handover(a, to_agent_r, from_agent_w), SECRET, "hash", now=0.0)
        self.challenge = frames.FrameDecoder().feed(os.read(self.from_agent, 65536))[0]

    def say(self, data: bytes) -> Accepted | Rejected | None:
        os.write(self.to_agent, data)
        return self.candidate.on_readable()

    def close(self) -> None:
        self.candidate.handover.close()
        for fd in (self.to_agent, self.from_agent):
            os.close(fd)
        self.peer.close()


@pytest.fixture
def host() -> Iterator[Host]:
    made = Host()
    yield made
    made.close()


def hello(nonce: str, host_nonce: str = "cd" * 32, secret: str = SECRET) -> bytes:
    frame = {"type": frames.HELLO, "nonce": host_nonce}
    proof = frames.adoption_proof(secret, frames.HOST_ROLE, nonce, host_nonce, frame)
    return frames.encode({**frame, "proof": proof})


def test_the_agent_challenges_with_a_fresh_nonce(host: Host) -> None:
    challenge = host.challenge
    assert isinstance(challenge, dict) and challenge["type"] == frames.CHALLENGE
    assert len(challenge["nonce"]) == 2 * frames.NONCE_BYTES and challenge["nonce"] != Host().challenge


def test_the_agent_accepts_the_secrets_proof(host: Host) -> None:
    challenge = host.challenge
    assert isinstance(challenge, dict)
    verdict = host.say(hello(challenge["nonce"]))
    assert verdict == Accepted("cd" * 32)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe garbage\n", "garbage"),
        (frames.encode({"type": frames.ACK, "seq": 1}), "not a hello"),
        (frames.encode({"type": frames.HELLO, "nonce": "cd" * 32}), "does not match"),
        (frames.encode({"type": frames.HELLO, "proof": "00"}), "no nonce"),
    ],
)
def test_the_agent_rejects_a_host_that_cannot_prove_it(host: Host, data: bytes, reason: str) -> None:
    verdict = host.say(data)
    assert isinstance(verdict, Rejected) and reason in verdict.reason, verdict


def test_the_agent_rejects_a_proof_of_another_secret_or_another_challenge(host: Host) -> None:
    challenge = host.challenge
    assert isinstance(challenge, dict)
    assert isinstance(host.say(hello(challenge["nonce"], secret="00" * 32)), Rejected)
    other = Host()
    try:  # a proof replayed from another challenge
        assert isinstance(other.say(hello(challenge["nonce"])), Rejected)
    finally:
        other.close()


# -- while detached ---------------------------------------------------------------------------------
def write_all(sink: list[bytes]) -> Callable[[memoryview], int]:
    def write(data: memoryview) -> int:
        sink.append(bytes(data))
        return len(data)

    return write


def test_frames_a_host_did_not_acknowledge_go_to_the_next_host() -> None:
    box = Outbox(retain=True)
    for i in range(4):
        box.append(f"f{i}\n".encode(), Kind.OUTPUT)
    first: list[bytes] = []
    box.flush(write_all(first))
    assert b"".join(first) == b"f0\nf1\nf2\nf3\n"
    box.ack(2)  # the host handled two, then died with the rest in its pipe
    box.rewind()
    again: list[bytes] = []
    box.flush(write_all(again))
    assert b"".join(again) == b"f2\nf3\n" and box.next_seq == 3


def test_past_the_buffer_the_oldest_output_goes_first_counted() -> None:
    box = Outbox(retain=True)
    box.append(b"r" * 100, Kind.RPC)
    for _ in range(10):
        box.append(b"o" * 100, Kind.OUTPUT)
    box.rewind()
    box.trim(500)
    assert box.held <= 500 and box.take_dropped() == (6, 600)
    kept: list[bytes] = []
    box.flush(write_all(kept))
    written = b"".join(kept)
    assert written[:100] == b"r" * 100  # the host call is kept over the output
    assert written[100:] == b"o" * 400
    assert box.forget([Kind.RPC]) == 1


def test_a_burst_of_frames_goes_out_in_one_write_and_a_short_write_resumes_mid_frame() -> None:
    box = Outbox(retain=True)
    for letter in b"abc":
        box.append(bytes([letter]) * 100)
    writes: list[bytes] = []

    def short(data: memoryview) -> int:  # a pipe that takes 150 bytes, then nothing
        if writes:
            raise BlockingIOError
        writes.append(bytes(data[:150]))
        return 150

    box.flush(short)
    assert writes == [b"a" * 100 + b"b" * 50], "three frames joined, a and half of b taken"
    assert box.pending == 150 and box.unacked == 150
    kept: list[bytes] = []
    box.flush(write_all(kept))
    assert kept == [b"b" * 50 + b"c" * 100], "b from where it stopped, with c"
    assert box.ack(3) == [] and len(box) == 0 and box.held == 0
    big = b"x" * (outbox.COALESCE_BYTES + 1)
    box.append(b"s" * 10)
    box.append(big)
    kept.clear()
    box.flush(write_all(kept))
    assert kept == [b"s" * 10, big], "a large frame goes alone"


def test_a_journal_torn_by_a_sigkill_is_resumed(tmp_path: Path) -> None:
    path = tmp_path / "1.journal.jsonl"
    path.write_bytes(b'{"type": "header"}\n{"type": "cell", "code": "x = 1"}\n{"type": "cell", "co')
    journal = Journal(path, budget=1 << 20, setting="KERNELBRIDGE_JOURNAL_BUDGET")
    assert journal.resume() is True
    assert journal.cells == 1 and path.read_bytes().endswith(b'"co\n')
    assert Journal(path, budget=1 << 20, setting="x").resume() is False
