"""Notebook exports requested by a model: what may be read, and where a file may be written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.notebook import load_session_notebook


def load_notebook(settings: Settings, session: str) -> Any:
    try:
        return load_session_notebook(settings.sessions_dir, session)
    except KernelBridgeError as exc:
        raise ToolError(str(exc)) from None


def export_target(settings: Settings, path: str) -> Path:
    """Where export_notebook may write: only ``.ipynb`` files, relative paths under the state dir.

    The path comes from the model, so it must not become a way to write arbitrary host files.
    """
    target = Path(path).expanduser()
    if target.suffix != ".ipynb":
        raise ToolError(f"path must end in .ipynb, got {path!r}")
    if not target.is_absolute():
        target = settings.state_dir / "exports" / target
    target = target.resolve()
    if not target.parent.is_dir():
        if target.parent.is_relative_to(settings.state_dir.resolve()):
            target.parent.mkdir(parents=True, exist_ok=True)
        else:
            raise ToolError(f"directory {str(target.parent)!r} does not exist")
    return target
