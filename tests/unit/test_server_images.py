"""Images fitted to the budget on the host: downscaled PNGs, links, dedup, hostile inputs."""

from __future__ import annotations

import base64
import io
import json
import random
import zlib
from pathlib import Path

import anyio
import pytest
from PIL import Image

from kernelbridge.notebook.export import find_png as find_output
from kernelbridge.server.images import digest, downscale, fit_images
from kernelbridge.server.notes import ImageDownscaled

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def noise_png(width: int, height: int) -> str:
    """A PNG that compresses badly (random pixels), as big as a busy plot."""
    pixels = random.Random(width).randbytes(width * height * 3)
    image = Image.frombytes("RGB", (width, height), pixels)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_images_over_the_budget_are_downscaled_with_a_link_and_sent_once() -> None:
    big, small = noise_png(400, 300), noise_png(20, 10)
    with anyio.fail_after(30):
        fitted = await fit_images([big, small, big], "s", budget=30_000)
    kinds = [block.type for block in fitted.blocks]
    assert kinds == ["image", "resource_link", "image"]
    resized = Image.open(io.BytesIO(base64.b64decode(fitted.blocks[0].data)))
    assert len(fitted.blocks[0].data) <= 30_000 and resized.size[0] < 400
    assert abs(resized.size[0] / resized.size[1] - 4 / 3) < 0.03
    assert fitted.blocks[1].uri == f"kernelbridge://sessions/s/outputs/{digest(big)}.png"
    assert fitted.blocks[2].data == small
    (note,) = fitted.notes
    assert isinstance(note, ImageDownscaled) and note.number == 1 and note.original == (400, 300)
    assert note.size == resized.size and note.uri == fitted.blocks[1].uri


def test_hostile_images_are_not_decoded() -> None:
    assert downscale(base64.b64encode(b"not a png at all").decode(), 1000) is None
    assert downscale("%%% not base64", 1000) is None

    # A tiny PNG whose header claims a gigapixel: refused before any pixel is decoded.
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = (40_000).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    bomb = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 100))
        + chunk(b"IEND", b"")
    )
    assert downscale(base64.b64encode(bomb).decode(), 1000) is None


def test_the_original_is_found_in_the_journal(tmp_path: Path) -> None:
    png = noise_png(30, 20)
    journal = tmp_path / "s.journal.jsonl"
    cell = {
        "type": "cell",
        "outputs": [{"output_type": "display_data", "data": {"image/png": png}, "metadata": {}}],
    }
    journal.write_text(json.dumps({"type": "session"}) + "\n" + json.dumps(cell) + "\n")
    size = journal.stat().st_size
    assert find_output(journal, f"{digest(png)}.png", size) == base64.b64decode(png)
    assert find_output(journal, "0" * 24 + ".png", size) is None
    assert find_output(journal, "../../etc/passwd", size) is None
    assert find_output(journal, f"{digest(png)}.png", size - 100) is None  # past the read limit
