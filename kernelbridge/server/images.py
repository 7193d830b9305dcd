"""Images that fit a model's context: downscaled past a budget, the original kept as a resource.

Identical images of a result are sent once; one within ``Settings.image_budget`` base64 characters
is sent as it is; a bigger one is re-encoded smaller (aspect kept) until it fits, and sent with a
``ResourceLink`` to ``kernelbridge://sessions/<session>/outputs/<digest>.png``, read from the
session's journal. The image data comes from sandboxed code: the host decodes only PNG, within
:data:`MAX_PIXELS` (checked from the header) and ``session.cell.MAX_IMAGE_BYTES`` of input.
Design: docs/design/server.md.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ContentBlock, ImageContent, ResourceLink

from kernelbridge.config import Settings
from kernelbridge.notebook.export import digest, find_png
from kernelbridge.server.notes import ImageDownscaled, ImageNotDownscaled, ImagesNotSent
from kernelbridge.session.outcome import Note

log = logging.getLogger(__name__)

MAX_IMAGES = 10
"""Images sent per result; more would flood the model's context."""
MAX_PIXELS = 16_000_000
"""Largest image decoded on the host (64 MiB as RGBA): a PNG of a few KB can claim gigapixels."""
ATTEMPTS = 4
"""Re-encodings tried before giving up on fitting the budget (each aims lower than the last)."""


def output_uri(session: str, data: str) -> str:
    return f"kernelbridge://sessions/{session}/outputs/{digest(data)}.png"


@dataclass(slots=True)
class Fitted:
    """What a result sends for its images, and the notes that explain it."""

    blocks: list[ContentBlock] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Smaller:
    data: str
    size: tuple[int, int]
    original: tuple[int, int]


def downscale(data: str, budget: int) -> Smaller | None:
    """A PNG of ``data`` (base64 PNG) re-encoded within ``budget`` base64 characters, or None if
    it is not a PNG, too many pixels, or cannot be made to fit. Blocking: run it in a thread."""
    from PIL import Image

    try:
        raw = base64.b64decode(data, validate=True)
        with Image.open(io.BytesIO(raw), formats=["PNG"]) as image:
            width, height = image.size
            if width * height > MAX_PIXELS or width < 1 or height < 1:
                return None
            image.load()
            mode = "RGBA" if "A" in image.getbands() or "transparency" in image.info else "RGB"
            pixels = image.convert(mode)
    except (OSError, ValueError, binascii.Error, SyntaxError, Image.DecompressionBombError):
        return None
    scale = min(1.0, math.sqrt(budget / max(len(data), 1)) * 0.9)
    for _ in range(ATTEMPTS):
        size = (max(1, int(width * scale)), max(1, int(height * scale)))
        buffer = io.BytesIO()
        pixels.resize(size, Image.Resampling.LANCZOS).save(buffer, "PNG", optimize=True)
        encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
        if len(encoded) <= budget:
            return Smaller(encoded, size, (width, height))
        scale *= math.sqrt(budget / len(encoded)) * 0.9
    return None


async def fit_images(images: list[str], session: str, budget: int) -> Fitted:
    """Content blocks for a result's images (see the module docstring)."""
    fitted = Fitted()
    unique = list(dict.fromkeys(images))
    if len(unique) > MAX_IMAGES:
        fitted.notes.append(ImagesNotSent(len(unique) - MAX_IMAGES, MAX_IMAGES))
    for n, data in enumerate(unique[:MAX_IMAGES], 1):
        if len(data) <= budget:
            fitted.blocks.append(ImageContent(type="image", data=data, mime_type="image/png"))
            continue
        uri = output_uri(session, data)
        link = ResourceLink(
            type="resource_link",
            name=f"image-{n}-full-size",
            uri=uri,
            mime_type="image/png",
            size=len(data) * 3 // 4,
            description="The full-size original of a downscaled image output",
        )
        smaller = await anyio.to_thread.run_sync(downscale, data, budget)
        kb = len(data) * 3 // 4 // 1024
        if smaller is None:
            fitted.blocks.append(link)
            fitted.notes.append(ImageNotDownscaled(n, kb, budget, uri))
            continue
        fitted.blocks.append(ImageContent(type="image", data=smaller.data, mime_type="image/png"))
        fitted.blocks.append(link)
        fitted.notes.append(ImageDownscaled(n, kb, smaller.original, smaller.size, uri))
    return fitted


def register_output_resources(
    app: MCPServer[Any],
    settings_of: Callable[[Context], Settings],
    reader_of: Callable[[Context], anyio.CapacityLimiter],
) -> None:
    """Add the full-size image outputs resource to ``app`` (an MCPServer); ``settings_of(ctx)``
    are the settings of a request's client (HTTP clients each have their own sessions directory),
    ``reader_of(ctx)`` its namespace's journal reader (one at a time per namespace)."""
    from mcp.server.mcpserver.exceptions import ResourceError

    from kernelbridge.notebook.journal import journal_read_limit
    from kernelbridge.server.exports import in_worker
    from kernelbridge.session.store import SessionStore, validate_session_name

    @app.resource(
        "kernelbridge://sessions/{session}/outputs/{name}",
        name="session-output",
        description="A full-size image output of a session (linked from downscaled images)",
        mime_type="image/png",
    )
    async def output_image(session: str, name: str, ctx: Context) -> bytes:
        try:
            settings = settings_of(ctx)
            store = SessionStore.of(settings)
            journal = await anyio.to_thread.run_sync(store.journal_or_none, validate_session_name(session))
        except Exception as exc:
            raise ResourceError(str(exc)) from None
        data = None
        if journal is not None:  # in a worker process, one at a time per namespace (up to the budget)
            data = await in_worker(reader_of(ctx), find_png, journal, name, journal_read_limit(settings))
        if data is None:
            raise ResourceError(f"no image output {name!r} in session {session!r}")
        return data
