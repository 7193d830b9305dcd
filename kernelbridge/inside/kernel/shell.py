"""The sandbox kernel's shell: ZMQInteractiveShell, showing exceptions as the sandbox API means them.

``SandboxKernel.shell_class`` (``kernel_class.py``); runs inside the container, in the kernel process.
Every exception IPython shows passes through the sandbox ``mcp`` package's
``_tracebacks.shown`` first (kernelbridge's own frames at the end of a traceback left out, a
NameError of an API name in a kernel without a host said as ``McpUnavailable``): in the cell's
``error`` output and in the execute reply, whose ``ename``/``evalue`` ipykernel takes from the
run's result rather than from what was shown, so the shell puts the shown exception there too.

Why a shell class and not ``set_custom_exc``: that is one slot, which a user's own handler would
silently take over, and its handler is called in place of IPython's display rather than before it.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from ipykernel.zmqshell import ZMQInteractiveShell

ExcInfo = tuple[type[BaseException], BaseException, types.TracebackType | None]


class SandboxShell(ZMQInteractiveShell):
    """ZMQInteractiveShell whose tracebacks show the sandbox API's errors at the user's line."""

    def showtraceback(
        self,
        exc_tuple: Any = None,
        filename: str | None = None,
        tb_offset: int | None = None,
        exception_only: bool = False,
        running_compiled_code: bool = False,
    ) -> None:
        try:
            exc_tuple = self._as_shown(self._get_exc_info(exc_tuple))
        except ValueError:
            pass  # no exception at all: IPython says so itself
        super().showtraceback(exc_tuple, filename, tb_offset, exception_only, running_compiled_code)

    def _as_shown(self, exc_info: ExcInfo) -> ExcInfo:
        try:
            # The sandbox's mcp package (first on PYTHONPATH), by name: mypy's `mcp` is the MCP SDK.
            shown = importlib.import_module("mcp._tracebacks").shown
            etype, value, tb = shown(*exc_info)
        except (Exception, KeyboardInterrupt):
            return exc_info  # never worse than IPython's own display
        result = getattr(self.displayhook, "exec_result", None)
        if value is not exc_info[1] and result is not None and result.error_in_exec is exc_info[1]:
            result.error_in_exec = value  # the execute reply's ename and evalue
        return etype, value, tb
