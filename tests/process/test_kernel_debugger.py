"""The sandbox kernel offers no debugger (as its kernelspec says) and so never loads debugpy at
start, yet a cell may still import debugpy; and it answers without ipykernel's sleep before each
reply. A local ipykernel started with the agent's flags and extensions (sandbox_kernel_fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_kernel_fixture import SandboxKernel, sandbox_kernel


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[SandboxKernel]:
    with sandbox_kernel(tmp_path, with_host=False) as k:
        yield k


def test_the_kernel_starts_without_debugpy_and_offers_no_debugger(kernel: SandboxKernel) -> None:
    loaded = kernel.value("import sys\nsorted(m for m in ('debugpy', 'pydevd') if m in sys.modules)")
    assert loaded == [], "the kernel imported debugpy at start"
    reply = kernel.client.kernel_info(reply=True, timeout=30)["content"]
    assert reply["status"] == "ok"
    assert not reply.get("debugger") and "debugger" not in reply.get("supported_features", [])


def test_a_cell_may_still_import_debugpy(kernel: SandboxKernel) -> None:
    assert kernel.value("import debugpy\ndebugpy.__name__") == "debugpy"


def test_the_kernel_does_not_sleep_before_its_replies(kernel: SandboxKernel) -> None:
    """ipykernel sleeps 0.5 ms before each execute_reply unless told not to (the agent's flags);
    the host ends a cell at the reply and iopub's idle, so outputs printed last are still in."""
    assert kernel.value("get_ipython().kernel._execute_sleep") == 0
    assert kernel.run("print('last words', end='')").stdout == "last words"
