"""A bridge answers ``initialize`` while it starts (issue 24): the lists at once, a call once the
start is done; with sessions a bridge before left, it answers once they are adopted.

In process, over the local test-double runtime whose engine is held (it answers nothing until
the test lets it: a podman service starting, an engine on a busy machine), with the SDK's
in-memory client. How long a real bridge takes is bench/bench_start.py's; the integration suites
run real bridges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from mcp.client.client import Client

from kernelbridge.config import Settings, load_settings
from kernelbridge.runtime.base import RuntimeInfo
from kernelbridge.server.app import build_server
from kernelbridge.session.store import SessionStore
from kernelbridge.testing import LocalProcessRuntime

pytestmark = pytest.mark.anyio

NOT_BEFORE = 1.0
"""How long a test gives the bridge to answer what it must not answer yet: a bridge that does
not wait answers in milliseconds; one that waits never does while the engine is held."""
ANSWER = 10.0
"""Bound on what a bridge answers at once (milliseconds in process; a loaded machine)."""


@dataclass
class HeldRuntime(LocalProcessRuntime):
    """The local double, whose engine answers its first question only once ``released`` is set."""

    asked: anyio.Event = field(default_factory=anyio.Event)
    released: anyio.Event = field(default_factory=anyio.Event)

    async def info(self) -> RuntimeInfo:
        self.asked.set()
        await self.released.wait()
        return await super().info()


def settings_of(state: Path) -> Settings:
    # No warm pool: the double's warm sandbox would be an agent process of its own, and nothing
    # here needs one.
    return load_settings({"KERNELBRIDGE_STATE_DIR": str(state), "KERNELBRIDGE_WARM_POOL": "0"})


async def test_initialize_and_the_tool_list_are_answered_while_the_bridge_starts(tmp_path: Path) -> None:
    runtime = HeldRuntime()
    async with runtime:
        app = build_server(settings_of(tmp_path / "state"), runtime=runtime)
        listed, answered = anyio.Event(), anyio.Event()
        answers: list[str] = []

        async def connect() -> None:
            async with Client(app) as client:
                tools = await client.list_tools()
                assert "run_python" in {tool.name for tool in tools.tools}
                listed.set()
                answer = await client.call_tool("list_sessions", {})
                answers.append(answer.content[0].text)  # type: ignore[union-attr]
                answered.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(connect)
                with anyio.move_on_after(ANSWER):
                    await listed.wait()
                assert listed.is_set()  # initialize and tools/list, with the engine held
                await runtime.asked.wait()
                with anyio.move_on_after(NOT_BEFORE):
                    await answered.wait()
                assert answers == []  # the call waits for the start
                runtime.released.set()
        assert json.loads(answers[0]) == {"sessions": [], "warm": 0}


async def test_a_bridge_with_sessions_to_adopt_answers_initialize_once_it_started(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = SessionStore(state)  # a session a bridge before left, detached (its sandbox is gone)
    store.detach(store.begin("left", container="kb-left", container_id="local-gone", secret="s" * 32))
    runtime = HeldRuntime()
    async with runtime:
        app = build_server(settings_of(state), runtime=runtime)
        initialized = anyio.Event()
        codes: list[str] = []

        async def connect() -> None:
            async with Client(app) as client:
                initialized.set()
                answer = await client.call_tool("run_python", {"code": "1", "session": "left"})
                codes.extend((answer.structured_content or {}).get("note_codes", []))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(connect)
                await runtime.asked.wait()
                with anyio.move_on_after(NOT_BEFORE):
                    await initialized.wait()
                assert not initialized.is_set()  # the adoption comes first
                runtime.released.set()
        # Adopted at start, before initialize was answered: found lost (the double has no such
        # container), which the first call says.
        assert codes == ["sandbox_lost"]
