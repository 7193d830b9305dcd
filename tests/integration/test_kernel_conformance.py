"""The Jupyter community's kernel conformance suite (jupyter_kernel_test) against the installed
``kernelbridge`` kernelspec: a real sandbox container behind the provisioner and tunnel process,
driven by jupyter_client exactly as any Jupyter front end drives a kernel.

The kernelspec is installed into a temporary prefix found through ``JUPYTER_PATH``; the state
directory is temporary too, so the suite shares nothing with a user's setup.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import jupyter_kernel_test as jkt
import pytest
from jupyter_kernel_test.msgspec_v5 import validate_message

from kernelbridge.jupyter import install_kernelspec
from kernelbridge.jupyter.manager import wait_for_heartbeat_loop

pytestmark = [pytest.mark.podman, pytest.mark.slow]

IOPUB_WAIT = 10.0
"""Bound on each iopub message of a cell once its reply is in. jupyter_kernel_test waits 0.1 s: a
local kernel's timing, not the protocol's. Here each message crosses the tunnel (the container's
stdout, the tunnel process), and a loaded 2-core machine can hold one back longer than that."""


class _KernelspecEnv:
    """The environment a test class needs to start ``kernelbridge`` kernels; undone afterwards."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kernelbridge-jkt-"))
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> _KernelspecEnv:
        if shutil.which("podman") is None:
            pytest.skip("podman is not installed")
        from kernelbridge.testing import ensure_sandbox_image

        ensure_sandbox_image()
        install_kernelspec(prefix=str(self.root / "prefix"))
        for key, value in {
            "JUPYTER_PATH": str(self.root / "prefix" / "share" / "jupyter"),
            "KERNELBRIDGE_STATE_DIR": str(self.root / "state"),
        }.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.root, ignore_errors=True)


class _InKernelspecEnv:
    """Runs a jupyter_kernel_test class (its kernel started in ``setUpClass``) in a
    :class:`_KernelspecEnv`; first among the bases, so that its class methods wrap the suite's."""

    _env: ClassVar[_KernelspecEnv]

    @classmethod
    def setUpClass(cls) -> None:
        cls._env = _KernelspecEnv().__enter__()
        try:
            super().setUpClass()
        except BaseException:
            cls._env.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            # The suite's own teardown stops the client's channels: its heartbeat thread must have
            # begun (tests/process/test_jupyter_heartbeat.py). The iopub welcome test is done a
            # millisecond after it starts them, and a loaded `make test` saw the thread begin later.
            wait_for_heartbeat_loop(cls.kc)  # type: ignore[attr-defined]
            super().tearDownClass()
        finally:
            cls._env.__exit__(None, None, None)


class KernelbridgeKernelTests(_InKernelspecEnv, jkt.KernelTests):
    """Every sample is one ipykernel itself passes with; the sandbox must not change any answer."""

    kernel_name = "kernelbridge"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples: ClassVar = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples: ClassVar = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples: ClassVar = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples: ClassVar = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise"
    code_execute_result: ClassVar = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data: ClassVar = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
    ]  # fmt: skip
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    def execute_helper(
        self,
        code: str,
        timeout: int = jkt.TIMEOUT,
        silent: bool = False,
        store_history: bool = True,
        stop_on_error: bool = True,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """jupyter_kernel_test's own, each iopub message awaited for :data:`IOPUB_WAIT`: the same
        messages, in the same order, checked the same way."""
        msg_id = self.kc.execute(
            code=code, silent=silent, store_history=store_history, stop_on_error=stop_on_error
        )
        reply = self.get_non_kernel_info_reply(timeout=timeout)
        assert reply is not None
        validate_message(reply, "execute_reply", msg_id)
        busy = self.kc.iopub_channel.get_msg(timeout=IOPUB_WAIT)
        validate_message(busy, "status", msg_id)
        self.assertEqual(busy["content"]["execution_state"], "busy")
        outputs = []
        while True:
            msg = self.kc.iopub_channel.get_msg(timeout=IOPUB_WAIT)
            validate_message(msg, msg["msg_type"], msg_id)
            if msg["msg_type"] == "status":
                self.assertEqual(msg["content"]["execution_state"], "idle")
                return reply, outputs
            if msg["msg_type"] == "execute_input":
                self.assertEqual(msg["content"]["code"], code)
                continue
            outputs.append(msg)


class KernelbridgeIopubWelcomeTests(_InKernelspecEnv, jkt.IopubWelcomeTests):
    """JEP 65: the tunnel's host-side iopub is an XPUB that greets each subscription with an
    ``iopub_welcome`` before anything else (``tunnel/sockets.py``), as ipykernel's own does."""

    kernel_name = "kernelbridge"
    support_iopub_welcome = True
