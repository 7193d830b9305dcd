"""The task table of ``run_python`` as an MCP task (kernelbridge.server.tasks): records, their
files, bad ids and other namespaces, status lines. No subprocess, no MCP transport."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from kernelbridge.runtime.reaper import process_start
from kernelbridge.server.tasks import MAX_TASKS, TaskRecord, TaskStore, TaskTable, status_message

pytestmark = pytest.mark.anyio


def table(tmp_path: Path) -> TaskTable:
    return TaskTable(lambda namespace: tmp_path / (namespace or "shared"))


async def test_a_task_is_found_by_its_id_in_its_own_namespace_only(tmp_path: Path) -> None:
    tasks = table(tmp_path)
    record = tasks.store("alice").create("default", None)
    assert tasks.find("alice", record.task_id) is record
    with pytest.raises(MCPError, match=r"no task .* here \(unknown, expired, or another token.s\)"):
        tasks.find("bob", record.task_id)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "", "x" * 500, "a/b", "nope"])
async def test_a_bad_or_unknown_task_id_is_one_line(tmp_path: Path, bad: str) -> None:
    with pytest.raises(MCPError) as raised:
        table(tmp_path).find("", bad)
    message = raised.value.error.message
    assert "\n" not in message and len(message) < 200


async def test_an_ended_task_is_read_back_by_another_bridge(tmp_path: Path) -> None:
    first = table(tmp_path).store("")
    record = first.create("s", 60_000)
    result = {"content": [{"type": "text", "text": "42"}], "isError": False}
    record.end("completed", result=result)
    first.save(record)
    again = table(tmp_path).find("", record.task_id)  # a new bridge process: a fresh table
    assert again is not record and again.status == "completed" and again.result == result
    assert again.done.is_set()


async def test_a_task_left_running_by_its_bridge_is_failed_with_where_its_outcome_is(tmp_path: Path) -> None:
    record = table(tmp_path).store("").create("train", None)  # saved as working; the bridge dies
    again = table(tmp_path).find("", record.task_id)
    assert again.status == "failed" and again.result is None
    assert again.error is not None and "session 'train'" in again.error and "journal" in again.error


async def test_a_task_left_running_is_taken_over_once_by_the_next_bridge(tmp_path: Path) -> None:
    record = table(tmp_path).store("").create("train", None)
    taken: list[tuple[TaskRecord, str]] = []
    tasks = TaskTable(
        lambda namespace: tmp_path / (namespace or "shared"), lambda r, _, left: taken.append((r, left))
    )
    tasks.take_over("")
    assert [r.task_id for r, _ in taken] == [record.task_id]
    again, left = taken[0]
    assert again.live and again.status == "working" and again.cell == record.cell
    assert "session 'train'" in left  # what it ends with if there is no cell to follow
    assert tasks.find("", record.task_id) is again and len(taken) == 1


async def test_a_task_of_another_running_bridge_is_not_taken_over(tmp_path: Path) -> None:
    store = table(tmp_path).store("")
    record = store.create("train", None)
    # another process that is still running (this test's parent)
    record.bridge, record.bridge_start = os.getppid(), process_start(os.getppid())
    store.save(record)
    taken: list[TaskRecord] = []
    tasks = TaskTable(lambda namespace: tmp_path / (namespace or "shared"), lambda r, _, __: taken.append(r))
    found = tasks.find("", record.task_id)
    assert not taken and found.status == "working" and not found.live


async def test_a_task_whose_bridge_pid_was_given_to_another_process_is_taken_over(tmp_path: Path) -> None:
    store = table(tmp_path).store("")
    record = store.create("train", None)
    started = process_start(os.getppid())
    assert started is not None, "this test needs /proc"
    # The bridge that wrote it is gone and its pid now names a later process (this test's parent).
    record.bridge, record.bridge_start = os.getppid(), started - 1
    store.save(record)
    taken: list[TaskRecord] = []
    tasks = TaskTable(lambda namespace: tmp_path / (namespace or "shared"), lambda r, _, __: taken.append(r))
    found = tasks.find("", record.task_id)
    assert taken == [found] and found.live and found.bridge == os.getpid()


async def test_an_expired_task_is_unknown(tmp_path: Path) -> None:
    store = table(tmp_path).store("")
    record = store.create("s", 1000)
    record.created -= 10
    store.save(record)
    assert table(tmp_path).store("").find(record.task_id) is None


async def test_an_unreadable_record_is_unknown_not_a_crash(tmp_path: Path) -> None:
    store = table(tmp_path).store("")
    record = store.create("s", None)
    (store.directory / f"{record.task_id}.json").write_text("{not json")
    assert TaskStore("", store.directory).find(record.task_id) is None
    (store.directory / f"{record.task_id}.json").write_text(json.dumps({"task_id": 1}))
    assert TaskStore("", store.directory).find(record.task_id) is None


async def test_records_are_bounded(tmp_path: Path) -> None:
    store = table(tmp_path).store("")
    for _ in range(MAX_TASKS + 20):
        record = store.create("s", None)
        record.end("completed", result={"content": []})
        store.save(record)
    assert len(list(store.directory.glob("*.json"))) <= MAX_TASKS + 1


async def test_the_ttl_asked_for_is_bounded(tmp_path: Path) -> None:
    store = table(tmp_path).store("")
    assert store.create("s", 10**15).ttl_ms == 7 * 24 * 3600 * 1000
    assert store.create("s", 1).ttl_ms == 1000


async def test_status_lines(tmp_path: Path) -> None:
    record = table(tmp_path).store("").create("s", None)
    assert status_message(record, None).startswith("waiting to start")
    ahead = {"seconds": 12, "latest_output": "epoch 3", "task": "task other"}
    assert status_message(record, ahead).startswith("queued behind task other")
    mine = {"seconds": 12, "latest_output": "epoch 3", "task": f"task {record.task_id}"}
    assert status_message(record, mine) == "running 12 s; latest output: epoch 3"
    record.end("cancelled", error="cancelled: the cell was interrupted")
    assert status_message(record, mine) == "cancelled: the cell was interrupted"
    assert record.task().status == "cancelled" and record.updated <= time.time()
