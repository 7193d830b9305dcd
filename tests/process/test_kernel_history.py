"""The sandbox kernel's input history: history_request answers tail, range and search from an
in-memory database without outputs, and what it keeps stays within bounds.

A local ipykernel started with the agent's flags and extensions (sandbox_kernel_fixture).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_kernel_fixture import SandboxKernel, sandbox_kernel

REPLY_TIMEOUT = 30.0


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SandboxKernel]:
    with sandbox_kernel(tmp_path, with_host=False) as k:
        yield k


def history(kernel: SandboxKernel, **args: Any) -> list[list[Any]]:
    msg_id = kernel.client.history(**args)
    deadline = time.monotonic() + REPLY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            reply = kernel.client.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return [list(entry) for entry in reply["content"]["history"]]
    raise AssertionError(f"no history_reply within {REPLY_TIMEOUT} s")


def test_history_answers_tail_range_and_search(kernel: SandboxKernel) -> None:
    for code in ("a = 1", "b = a + 1", "print(b)"):
        kernel.ok(code)
    tail = history(kernel, hist_access_type="tail", n=3, raw=True, output=False)
    assert [entry[2] for entry in tail] == ["a = 1", "b = a + 1", "print(b)"]
    session, start = tail[0][0], tail[0][1]
    ranged = history(
        kernel, hist_access_type="range", session=session, start=start, stop=start + 2, raw=True, output=False
    )
    assert [entry[2] for entry in ranged] == ["a = 1", "b = a + 1"]
    # The protocol's session numbers, not IPython's 0 for "the current session".
    assert session != 0 and {entry[0] for entry in ranged} == {session}
    found = history(kernel, hist_access_type="search", pattern="b =*", raw=True, output=False, n=10)
    assert [entry[2] for entry in found] == ["b = a + 1"]
    # Outputs are not kept: the output half of each entry is empty.
    with_output = history(kernel, hist_access_type="tail", n=1, raw=True, output=True)
    assert with_output[0][2] == ["print(b)", None]
    assert kernel.ok("%history -n -l 2").stdout.count("\n") == 2


def test_history_forgets_the_oldest_inputs_past_its_bounds(kernel: SandboxKernel) -> None:
    kernel.ok(
        "hooks = [cb.__self__ for cb in get_ipython().events.callbacks['post_run_cell']\n"
        "         if type(getattr(cb, '__self__', None)).__name__ == 'BoundedHistory']\n"
        "assert len(hooks) == 1\n"
        "hooks[0].max_cells = 5\n"
        "hooks[0].max_chars = 10_000"
    )
    for i in range(12):
        kernel.ok(f"x{i} = {i}")
    tail = history(kernel, hist_access_type="tail", n=100, raw=True, output=False)
    assert [entry[2] for entry in tail] == [f"x{i} = {i}" for i in range(7, 12)]
    # The oldest inputs are gone from the lists and the _i<n> variables too.
    left = kernel.value("[k for k in globals() if k.startswith('_i') and k[2:].isdigit()]")
    assert len(left) <= 6
    # One big input pushes out everything before it.
    kernel.ok("big = '" + "y" * 6000 + "'")
    tail = history(kernel, hist_access_type="tail", n=100, raw=True, output=False)
    assert len(tail) == 1 and tail[0][2].startswith("big = ")
