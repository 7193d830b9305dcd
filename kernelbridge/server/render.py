"""A cell's result as an MCP tool result: short text first (what a model reads), images as image
content, and the full record as ``structuredContent``."""

from __future__ import annotations

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent

from kernelbridge.session.cell import CellResult

MAX_IMAGES = 10
"""Images returned per call; more would flood the model's context."""


def render_text(result: CellResult) -> str:
    """The text a model reads: outputs verbatim, then one status line."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    if result.stderr:
        err = result.stderr if result.stderr.endswith("\n") else result.stderr + "\n"
        parts.append("[stderr]\n" + err)
    if result.error is not None:
        parts.append(result.error.traceback + "\n")
    if result.result is not None:
        parts.append(f"Out[{result.execution_count}]: {result.result}\n")
    parts.extend(note + "\n" for note in result.notes)
    where = f"[{result.execution_count}]" if result.execution_count is not None else ""
    line = f"-- {result.status}{' ' + where if where else ''} in session {result.session!r}, "
    line += f"{result.duration_ms} ms, state {result.state}"
    if result.truncated:
        line += ", output truncated"
    return "".join(parts) + line


def to_tool_result(result: CellResult, media: list[ContentBlock] | None = None) -> CallToolResult:
    """``media``: the images as they should be sent (``server/images.py`` fits them to the
    budget); by default the cell's images as they are."""
    content: list[ContentBlock] = [TextContent(type="text", text=render_text(result))]
    if media is not None:
        content.extend(media)
    for png in result.images[:MAX_IMAGES] if media is None else []:
        content.append(ImageContent(type="image", data=png, mime_type="image/png"))
    return CallToolResult(
        content=content, structured_content=result.structured(), is_error=result.status != "ok"
    )
