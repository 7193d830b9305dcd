"""The sandbox kernel offers no debugger (as its kernelspec says) and so never loads debugpy at
start, yet a cell may still import debugpy; and it answers without ipykernel's sleep before each
reply. A local ipykernel started with the agent's flags and extensions (sandbox_kernel_fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_kernel_fixture import SandboxKernel, sandbox_kernel

from kernelbridge.inside.kernel import HOST_CELL
from kernelbridge.inside.kernel.kernel_class import IPYKERNEL_PAUSE


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


def test_the_kernel_answers_the_hosts_cells_without_ipykernels_pause(kernel: SandboxKernel) -> None:
    """ipykernel sleeps 0.5 ms before each execute_reply (so that clients that stop at the reply
    have seen the last outputs); the bridge's own requests, marked, are answered without it, since
    the host ends a cell at the reply and iopub's idle. Other clients keep ipykernel's pause."""
    code = "print('last words', end='')\nget_ipython().kernel._execute_sleep"
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
    msg = kernel.client.session.msg("execute_request", content, metadata={HOST_CELL: True})
    kernel.client.shell_channel.send(msg)
    from_host = kernel.collect(msg["header"]["msg_id"])
    assert (from_host.status, from_host.result, from_host.stdout) == ("ok", "0.0", "last words")
    other = kernel.run(code)
    assert (other.status, other.result, other.stdout) == ("ok", str(IPYKERNEL_PAUSE), "last words")
    assert IPYKERNEL_PAUSE > 0
