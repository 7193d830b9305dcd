"""The sandbox's kernel class: ipykernel's IPythonKernel with protocol-exact history replies and
the sandbox's shell (``shell.py``: exceptions of the sandbox API shown at the user's line).

Started with ``--IPKernelApp.kernel_class=kernelbridge.inside.kernel.kernel_class.SandboxKernel``, in
the kernel process. ``history_reply`` names the current session by its real number (``%history`` is
unaffected); requests marked ``HOST_CELL`` are answered without ipykernel's pause before the
``execute_reply`` (other clients' keep it); no debugger is created (:func:`debugger_left_out`), though
cells may still import debugpy. Why: docs/design/sandbox.md.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelbase import Kernel

from kernelbridge.inside.kernel import HOST_CELL
from kernelbridge.inside.kernel.shell import SandboxShell

IPYKERNEL_PAUSE: float = Kernel._execute_sleep.default_value
"""ipykernel's pause before an execute_reply (0.5 ms), kept for other clients' requests."""
_pause: ContextVar[float] = ContextVar("kernelbridge_reply_pause", default=IPYKERNEL_PAUSE)


def debugger_left_out() -> None:
    """Import ``ipykernel.debugger`` (once) with debugpy absent: its ``_is_debugpy_available`` is
    then False, so the kernel creates no debugger and its kernel_info offers none."""
    if "ipykernel.debugger" in sys.modules:
        return
    had = sys.modules.get("debugpy")
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # "not installed", for this import
    try:
        import ipykernel.debugger  # noqa: F401
    finally:
        if had is None:
            del sys.modules["debugpy"]
        else:
            sys.modules["debugpy"] = had


class SandboxKernel(IPythonKernel):
    """IPythonKernel whose ``history_reply`` names the current session by its number, with the
    sandbox's shell, no debugger, and no pause before the host's replies."""

    def __new__(cls, *args: Any, **kwargs: Any) -> SandboxKernel:
        # Before traitlets resolves the class's ``debugger_class`` (on creation, before __init__).
        debugger_left_out()
        return super().__new__(cls, *args, **kwargs)

    # A plain class attribute in place of IPythonKernel's trait of the same name (which is not
    # configurable either): IPythonKernel.__init__ makes ``self.shell_class.instance(...)``.
    shell_class = SandboxShell

    # Read by Kernel.execute_request once per request, in its task (ipykernel's trait of the same
    # name is not configured here); set per request by execute_request below.
    @property
    def _execute_sleep(self) -> float:  # type: ignore[override]
        return _pause.get()

    async def execute_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        metadata = parent.get("metadata")
        from_host = isinstance(metadata, dict) and metadata.get(HOST_CELL) is True
        token = _pause.set(0.0 if from_host else IPYKERNEL_PAUSE)
        try:
            await super().execute_request(stream, ident, parent)
        finally:
            _pause.reset(token)

    # IPythonKernel answers history requests synchronously (ipykernel 7.4: a plain method, although
    # Kernel declares a coroutine, which kernelbase awaits only if it gets one); this keeps its form.
    def do_history(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        reply: dict[str, Any] = super().do_history(*args, **kwargs)
        current = getattr(getattr(self.shell, "history_manager", None), "session_number", None)
        if isinstance(current, int) and isinstance(reply.get("history"), list):
            reply["history"] = [
                (current, *entry[1:]) if entry and entry[0] == 0 else entry for entry in reply["history"]
            ]
        return reply
