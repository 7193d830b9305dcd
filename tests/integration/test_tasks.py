"""``run_python`` as an MCP task, end to end: a real bridge over stdio and the SDK's client at
2025-11-25 (``mode="legacy"``): the task at once, polled, its result, cancelled, and its result
fetched by id by a new client of a new bridge process after a restart, also of a task whose cell
still ran when its client quit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from bridge_harness import Bridge, open_bridge, open_http_bridge, podman
from durable_harness import wait_for, workspace_files
from mcp.shared.exceptions import MCPError

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("sandbox_image")]

BOUND = 120.0


async def start_task(bridge: Bridge, code: str, session: str = "default") -> types.Task:
    params = types.CallToolRequestParams(
        name="run_python",
        arguments={"code": code, "session": session},
        task=types.TaskMetadata(ttl=3_600_000),
    ).model_dump(by_alias=True, mode="json", exclude_none=True)
    # The SDK's ClientSession checks a 2025-11-25 tools/call answer as a CallToolResult only (it has
    # no task client): the same session's dispatcher sends it, and the answer is checked here.
    dispatcher = bridge.client.session._dispatcher
    with anyio.fail_after(BOUND):
        raw = await dispatcher.send_raw_request("tools/call", params, {"timeout": BOUND})
    return types.CreateTaskResult.model_validate(raw, by_name=False).task


async def get(bridge: Bridge, task_id: str) -> types.GetTaskResult:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await bridge.client.session.send_request(request, types.GetTaskResult)


async def result(bridge: Bridge, task_id: str) -> types.CallToolResult:
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    with anyio.fail_after(BOUND):
        return await bridge.client.session.send_request(request, types.CallToolResult)


async def cancel(bridge: Bridge, task_id: str) -> types.CancelTaskResult:
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    with anyio.fail_after(BOUND):
        return await bridge.client.session.send_request(request, types.CancelTaskResult)


async def until(bridge: Bridge, task_id: str, predicate: Any) -> types.GetTaskResult:
    task = None
    with anyio.move_on_after(BOUND):
        while True:
            task = await get(bridge, task_id)
            if predicate(task):
                return task
            await anyio.sleep(0.2)
    raise AssertionError(f"task {task_id} never came to the state looked for; last: {task}")


def text(answer: types.CallToolResult) -> str:
    return "\n".join(block.text for block in answer.content if isinstance(block, types.TextContent))


async def test_a_long_job_as_a_task_polled_cancelled_and_fetched_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with open_bridge(state, mode="legacy") as bridge:
        caps = bridge.client.server_capabilities
        assert caps.tasks is not None and caps.tasks.requests is not None
        listed = await bridge.client.list_tools()
        run_python = next(t for t in listed.tools if t.name == "run_python")
        assert run_python.execution is not None and run_python.execution.task_support == "optional"

        # A job that prints, then waits for a file the test writes: its status carries its output.
        task = await start_task(
            bridge,
            "import time, os\nx = 41\nprint('epoch 1', flush=True)\n"
            "while not os.path.exists('/workspace/go'): time.sleep(0.1)\nx + 1",
        )
        assert task.status == "working"
        seen = await until(bridge, task.task_id, lambda t: "epoch 1" in (t.status_message or ""))
        assert seen.status == "working" and "running" in (seen.status_message or "")
        sessions = {s["session"]: s for s in json.loads((await bridge.call("list_sessions"))[1])["sessions"]}
        assert sessions["default"]["running"]["latest_output"] == "epoch 1"
        assert sessions["default"]["running"]["task"] == f"task {task.task_id}"

        # Another call to that session queues behind the task and says so, within its own timeout.
        busy = await bridge.run("1", "default", timeout=2)
        assert busy.is_error and f"queued behind task {task.task_id}" in busy.text

        # Another session is free; it lets the job go on.
        await bridge.run("open('/workspace/go', 'w')", "other")  # not the job's /workspace
        await cancel(bridge, task.task_id)
        cancelled = await get(bridge, task.task_id)
        assert cancelled.status == "cancelled"
        with pytest.raises(MCPError, match="has no result: cancelled: the cell was interrupted"):
            await result(bridge, task.task_id)
        kept = await bridge.run("x", "default")
        assert kept.status == "ok" and "41" in kept.text  # interrupted, state kept

        done = await start_task(bridge, "print('hello'); x * 2")
        answer = await result(bridge, done.task_id)
        assert not answer.is_error and "82" in text(answer)
        assert (await get(bridge, done.task_id)).status == "completed"
        with pytest.raises(MCPError, match="no task 'nope' here"):
            await get(bridge, "nope")

    # The client restarts: a new bridge process on the same state directory has the result by id.
    async with open_bridge(state, mode="legacy") as again:
        answer = await result(again, done.task_id)
        assert "82" in text(answer)
        with pytest.raises(MCPError, match="cannot be cancelled: it is completed"):
            await cancel(again, done.task_id)
        listed_tasks = await again.client.session.send_request(
            types.ListTasksRequest(), types.ListTasksResult
        )
        assert {t.task_id for t in listed_tasks.tasks} >= {task.task_id, done.task_id}


WAITS = (
    "import time, os\nx = 41\nprint('epoch 1', flush=True)\n"
    "while not os.path.exists('/workspace/{go}'): print('tick', flush=True); time.sleep(0.5)\n"
)


def touch(container: str, name: str) -> None:
    """Create ``/workspace/NAME`` in the sandbox as its own user (a person's hand, not the bridge's)."""
    user = podman("inspect", "--format", "{{.Config.User}}", container).strip()
    podman("exec", "--user", user, container, "touch", f"/workspace/{name}")


async def test_a_task_still_running_when_its_stdio_client_quits_is_followed_by_the_next_bridge(
    tmp_path: Path,
) -> None:
    """A stdio client's bridge ends with its client; the durable sandbox runs the task's cell on.
    The next client's bridge takes the task over: working with its output, the session's calls
    queueing behind it, then its ordinary result by id; a second such task cancelled after the
    restart is interrupted with the session's variables kept."""
    state = tmp_path / "state"
    async with open_bridge(state, mode="legacy") as bridge:
        task = await start_task(bridge, WAITS.format(go="go") + "print('done', flush=True)\nx + 1")
        await until(bridge, task.task_id, lambda t: "tick" in (t.status_message or ""))
        container = await bridge.container("default")

    async with open_bridge(state, mode="legacy") as again:
        seen = await until(again, task.task_id, lambda t: "tick" in (t.status_message or ""))
        assert seen.status == "working" and "running" in (seen.status_message or "")
        busy = await again.run("1", "default", timeout=2)
        assert busy.is_error and f"queued behind task {task.task_id}" in busy.text
        touch(container, "go")
        answer = await result(again, task.task_id)
        assert not answer.is_error and "42" in text(answer) and "done" in text(answer), text(answer)
        assert (await get(again, task.task_id)).status == "completed"
        assert "41" in (await again.run("x", "default")).text
        second = await start_task(again, WAITS.format(go="never") + "x = 0")
        await until(again, second.task_id, lambda t: "tick" in (t.status_message or ""))

    async with open_bridge(state, mode="legacy") as third:
        await until(third, second.task_id, lambda t: "running" in (t.status_message or ""))
        assert (await cancel(third, second.task_id)).status == "cancelled"
        kept = await third.run("x", "default")
        assert kept.status == "ok" and "41" in kept.text  # interrupted before x = 0, state kept
        notebook = await third.notebook("default")  # each task's cell journalled once
        assert notebook.count("print('done', flush=True)") == 1 and notebook.count("x = 0") == 1
        # A third ends while no bridge is there: the next one has its result from the agent.
        code = WAITS.format(go="go3") + "print('after', flush=True)\nopen('/workspace/ended', 'w')\nx + 2"
        last = await start_task(third, code)
        await until(third, last.task_id, lambda t: "tick" in (t.status_message or ""))

    touch(container, "go3")

    await wait_for(
        lambda: "ended" in workspace_files(container), "the cell ended with no bridge there", BOUND
    )
    async with open_bridge(state, mode="legacy") as fourth:
        answer = await result(fourth, last.task_id)
        assert not answer.is_error and "43" in text(answer) and "after" in text(answer), text(answer)


async def test_clients_without_tasks_see_no_change(tmp_path: Path) -> None:
    async with open_bridge(tmp_path / "state") as bridge:  # the SDK's default (2026-07-28)
        tools = await bridge.client.list_tools()
        assert all(t.execution is None for t in tools.tools)
        ok = await bridge.run("1 + 1", "default")
        assert ok.status == "ok" and "2" in ok.text


async def test_over_http_a_task_is_its_tokens_own(tmp_path: Path) -> None:
    """Two tokens on one bridge: Bob cannot see, fetch or cancel Alice's task (the same line as a
    task that never existed), and Alice's task runs on to its result."""
    tokens = {"alice": "a" * 32, "bob": "b" * 32}
    async with open_http_bridge(tmp_path / "state", tokens, mode="legacy") as bridges:
        alice, bob = bridges["alice"], bridges["bob"]
        task = await start_task(alice, "import time\ntime.sleep(1)\n'done by alice'")
        for ask in (get, result, cancel):
            with pytest.raises(MCPError, match=f"no task '{task.task_id}' here"):
                await ask(bob, task.task_id)
        listed = await bob.client.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
        assert task.task_id not in {t.task_id for t in listed.tasks}
        answer = await result(alice, task.task_id)
        assert not answer.is_error and "done by alice" in text(answer)
