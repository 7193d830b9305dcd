"""The adoption's proofs cover the facts (issue 23): both ends sign every field of their handshake
frame, so anything relaying the handover's pipes without the secret cannot change what the
adopting bridge reports (how long the sandbox was detached, how its last bridge left, the
inherited cells, what was dropped) or what the agent is told.

- the codec: the canonical form both ends sign survives the frame codec's round trip (floats,
  escapes, a lone surrogate, key order), and every fact changes the proof;
- the host's side against a scripted sandbox: an ``adopted`` frame whose facts differ from the
  ones signed fails in one ``AdoptionFailed`` line;
- the agent's side (``Candidate``): a hello changed after it was signed is refused;
- end to end, the real agent (the local test double's process) and its real handover, with a
  relay between the bridge and the handover's pipes: passing the frames on is invisible, as it
  must be, but rewriting the ``adopted`` frame is caught and nothing is adopted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import pytest
from test_durable_handshake import NONCE, SECRET, Host, adopt, fails_with
from test_host_sandbox import Agent

from kernelbridge import frames
from kernelbridge.config import Settings
from kernelbridge.errors import AdoptionFailed
from kernelbridge.host import Sandbox, SandboxHandlers
from kernelbridge.inside.agent.adoption import Accepted, Rejected
from kernelbridge.runtime import ContainerStream
from kernelbridge.testing import LocalProcessRuntime

pytestmark = pytest.mark.anyio
FACTS: frames.Frame = {
    "type": frames.ADOPTED,
    "next": 7,
    "dropped": {"frames": 0, "bytes": 0},
    "detached": 3600.125,
    "idle": 0.1 + 0.2,  # not a short decimal: its repr must survive the trip
    "how": "eof",
    "cells": [{"msg_id": "m1", "code": "print('é \\ud800 \u2603')", "status": "running"}],
    "versions": {"python": "3.11.2"},
    "at": 1700000000.123456,
}


def signed(frame: frames.Frame, secret: str = SECRET, host_nonce: str = "cd" * 32) -> frames.Frame:
    proof = frames.adoption_proof(secret, frames.AGENT_ROLE, NONCE, host_nonce, frame)
    return {**frame, "proof": proof}


def through_the_codec(frame: frames.Frame) -> frames.Frame:
    (decoded,) = frames.FrameDecoder().feed(frames.encode(frame))
    assert isinstance(decoded, dict)
    return decoded


def test_the_canonical_form_survives_the_codec_and_ignores_key_order() -> None:
    frame = dict(FACTS)
    frame["cells"] = [{"msg_id": "m1", "code": "x = '\ud800'", "status": "ok"}]  # a lone surrogate
    sent = signed(frame)
    received = through_the_codec(sent)
    assert frames.canonical(received) == frames.canonical(sent)
    reordered = dict(reversed(list(received.items())))
    assert frames.canonical(reordered) == frames.canonical(sent)
    assert b"proof" not in frames.canonical(sent)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("detached", 1.0),
        ("idle", 0.3),
        ("how", "detach"),
        ("dropped", {"frames": 0, "bytes": 1}),
        ("cells", []),
        ("next", 8),
        ("at", 1700000000.0),
        ("extra", "a field the signer never wrote"),
    ],
)
def test_every_fact_changes_the_proof(field: str, value: object) -> None:
    changed = {**FACTS, field: value}
    assert signed(changed)["proof"] != signed(FACTS)["proof"]


async def test_an_adopted_frame_with_changed_facts_is_not_adopted(tmp_path: Path) -> None:
    async def relayed(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": NONCE})
        hello = await agent.got(frames.HELLO)
        true = signed(FACTS, host_nonce=hello["nonce"])
        # What a relay would want the bridge to say: a fresh sandbox, nothing lost, no cells.
        await agent.send({**true, "detached": 0.5, "how": "detach", "cells": []})
        await agent.got(frames.SHUTDOWN)

    await fails_with(tmp_path, relayed, "its answer was changed on the way")


async def test_the_same_frame_as_signed_is_adopted(tmp_path: Path) -> None:
    async def true(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": NONCE})
        hello = await agent.got(frames.HELLO)
        await agent.send(signed(FACTS, host_nonce=hello["nonce"]))
        await agent.got(frames.SHUTDOWN)

    sandbox = await adopt(tmp_path, true)
    assert sandbox.adoption is not None and sandbox.adoption.detached == 3600.125
    assert sandbox.adoption.how == "eof" and [c.msg_id for c in sandbox.adoption.cells] == ["m1"]


async def test_a_sandbox_without_the_secret_still_fails(tmp_path: Path) -> None:
    async def impostor(agent: Agent) -> None:
        await agent.send({"type": frames.CHALLENGE, "nonce": NONCE})
        hello = await agent.got(frames.HELLO)
        await agent.send(signed(FACTS, secret="00" * 32, host_nonce=hello["nonce"]))

    await fails_with(tmp_path, impostor, "not the one this session made")


@pytest.fixture
def host() -> Host:
    return Host()


@pytest.mark.parametrize("field", ["session", "agent_hash", "nonce"])
def test_the_agent_refuses_a_hello_changed_after_it_was_signed(host: Host, field: str) -> None:
    try:
        challenge = host.challenge
        assert isinstance(challenge, dict)
        hello = {"type": frames.HELLO, "session": "s", "agent_hash": "h", "nonce": "cd" * 32}
        hello["proof"] = frames.adoption_proof(SECRET, frames.HOST_ROLE, challenge["nonce"], "cd" * 32, hello)
        verdict = host.say(frames.encode({**hello, field: "ef" * 32}))
        assert isinstance(verdict, Rejected) and "does not match" in verdict.reason, verdict
    finally:
        host.close()


def test_the_agent_accepts_the_hello_as_signed(host: Host) -> None:
    try:
        challenge = host.challenge
        assert isinstance(challenge, dict)
        hello = {"type": frames.HELLO, "session": "s", "agent_hash": "h", "nonce": "cd" * 32}
        hello["proof"] = frames.adoption_proof(SECRET, frames.HOST_ROLE, challenge["nonce"], "cd" * 32, hello)
        assert host.say(frames.encode(hello)) == Accepted("cd" * 32)
    finally:
        host.close()


# -- a relay between the bridge and the real agent ------------------------------------------------
Rewrite = Callable[[frames.Frame], frames.Frame]


class RelayedStream(ContainerStream):
    """An exec session's stream passed through a relay that rewrites the sandbox's ``adopted``
    frame with ``rewrite`` (and passes everything else on as it came)."""

    def __init__(self, inner: ContainerStream, rewrite: Rewrite) -> None:
        self.inner = inner
        self.rewrite = rewrite
        self.pending = b""
        self.rewritten = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self.rewritten:
            return await self.inner.receive(max_bytes)
        while b"\n" not in self.pending:
            self.pending += await self.inner.receive(max_bytes)
        out = b""
        while b"\n" in self.pending and not self.rewritten:
            line, self.pending = self.pending.split(b"\n", 1)
            frame = json.loads(line)
            if frame.get("type") == frames.ADOPTED:
                frame, self.rewritten = self.rewrite(frame), True
            out += frames.encode(frame)
        if self.rewritten:
            out, self.pending = out + self.pending, b""
        return out

    async def send(self, item: bytes) -> None:
        await self.inner.send(item)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def stderr_tail(self) -> list[str]:
        return self.inner.stderr_tail()


class RelayingRuntime(LocalProcessRuntime):
    """The local test double, with a relay on every exec session (what code that ran as the
    handover could do with the new bridge's pipes)."""

    def __init__(self) -> None:
        super().__init__()
        self.rewrite: Rewrite = lambda frame: frame

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        inner = await super().attach_exec(container, command, user=user, workdir=workdir, env=env)
        return RelayedStream(inner, self.rewrite)


def pretend_fresh(frame: frames.Frame) -> frames.Frame:
    return {**frame, "detached": 0.0, "how": "detach", "cells": [], "dropped": {"frames": 0, "bytes": 0}}


async def test_a_relay_that_rewrites_the_real_agents_answer_is_caught(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, warm_pool=0, kernel_start_timeout=60)
    async with RelayingRuntime() as runtime, anyio.create_task_group() as tg:
        first = Sandbox.create(settings, runtime, "s", image="test-double", agent_hash=None, durable=True)
        await tg.start(first.run, SandboxHandlers())
        assert first.durability is not None and first.container_id is not None
        secret, container = first.durability.secret, first.container_id
        assert await first.detach()

        def adopter() -> Sandbox:
            return Sandbox.adopt(
                settings, runtime, "s", container_id=container, container_name=first.container_name,
                container_label=first.container_label, secret=secret, agent_hash=None,
            )  # fmt: skip

        runtime.rewrite = pretend_fresh
        with pytest.raises(AdoptionFailed) as caught:
            with anyio.fail_after(30):
                await tg.start(adopter().run, SandboxHandlers())
        said = str(caught.value)
        assert "changed on the way" in said and "\n" not in said, said

        runtime.rewrite = lambda frame: frame  # relaying alone changes nothing the bridge sees
        with anyio.fail_after(30):
            adopted = await tg.start(adopter().run, SandboxHandlers())
        # The caught bridge was attached as far as the agent knew: it left by its pipe's end.
        assert adopted.adoption is not None and adopted.adoption.how == "eof", adopted.adoption
        await adopted.close()
