"""Files in and out of a session's /workspace through MCP, and images that fit the context.

Real parts: ``kernelbridge serve`` over stdio with the MCP SDK's client, real sandboxes. Files
travel through the tunnel (the agent's fs requests); the test checks both directions with code
running in the kernel on the other side.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError

pytestmark = [pytest.mark.anyio, pytest.mark.podman]


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def run(client: Client, code: str, **args: Any) -> Any:
    return await client.call_tool("run_python", {"code": code, **args})


async def test_a_file_written_by_code_is_a_resource_and_a_placed_file_is_read_by_code(
    mcp_client: Client,
) -> None:
    blob = bytes(range(256)) * 3
    with anyio.fail_after(90):
        made = await run(
            mcp_client,
            "import os\nos.makedirs('out', exist_ok=True)\n"
            "open('out/report.txt', 'w').write('total: 42\\nähnlich\\n')\n"
            "open('out/data.bin', 'wb').write(bytes(range(256)) * 3)",
            session="files",
        )
        assert made.is_error is False, text_of(made)
        listing = json.loads(
            (await mcp_client.read_resource("kernelbridge://sessions/files/files")).contents[0].text
        )
        text = await mcp_client.read_resource("kernelbridge://sessions/files/files/out/report.txt")
        binary = await mcp_client.read_resource("kernelbridge://sessions/files/blobs/out/data.bin")
        with pytest.raises(MCPError, match="not UTF-8 text"):
            await mcp_client.read_resource("kernelbridge://sessions/files/files/out/data.bin")
        with pytest.raises(MCPError, match="no such file"):
            await mcp_client.read_resource("kernelbridge://sessions/files/files/out/missing.txt")
        with pytest.raises(MCPError):
            await mcp_client.read_resource("kernelbridge://sessions/files/files/../etc/passwd")
        with pytest.raises(MCPError, match="no live session"):
            await mcp_client.read_resource("kernelbridge://sessions/nobody/files")

        placed = await run(
            mcp_client,
            "import hashlib\nprint(open('in/notes.md').read())\n"
            "hashlib.sha256(open('in/raw.bin', 'rb').read()).hexdigest()",
            session="files",
            files={
                "in/notes.md": "# from the user\n",
                "in/raw.bin": "base64:" + base64.b64encode(blob).decode(),
            },
        )
        only_files = await run(mcp_client, "", session="files", files={"later.txt": "x"})
        traversal = await run(mcp_client, "1", session="files", files={"../escape.txt": "x"})
        absolute = await run(mcp_client, "1", session="files", files={"/etc/x": "x"})
        bad64 = await run(mcp_client, "1", session="files", files={"x.bin": "base64:not base64!"})
        after = await run(mcp_client, "sorted(os.listdir('.'))", session="files")

    entries = {e["path"]: e for e in listing["entries"]}
    assert entries["out"]["type"] == "dir"
    assert entries["out/report.txt"]["size"] == len("total: 42\nähnlich\n".encode())
    assert entries["out/report.txt"]["uri"] == "kernelbridge://sessions/files/files/out/report.txt"
    assert entries["out/data.bin"]["uri"] == "kernelbridge://sessions/files/blobs/out/data.bin"
    assert text.contents[0].text == "total: 42\nähnlich\n"
    assert base64.b64decode(binary.contents[0].blob) == blob
    assert binary.contents[0].mime_type == "application/octet-stream"

    assert placed.is_error is False, text_of(placed)
    assert placed.structured_content["stdout"] == "# from the user\n\n"
    assert placed.structured_content["result"] == repr(hashlib.sha256(blob).hexdigest())
    assert placed.structured_content["note_codes"] == ["files_placed"]
    assert only_files.is_error is False and text_of(only_files).startswith("Placed in /workspace: later.txt")
    for refused, why in (
        (traversal, "leaves /workspace"),
        (absolute, "is absolute"),
        (bad64, "not valid base64"),
    ):
        assert refused.is_error is True and why in text_of(refused), text_of(refused)
    assert after.structured_content["result"] == "['in', 'later.txt', 'out']"


def _png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", raw[16:24])


async def test_a_big_figure_is_sent_once_downscaled_with_a_link_to_the_original(connect: Any) -> None:
    code = (
        "import numpy as np, matplotlib.pyplot as plt\n"
        "rng = np.random.default_rng(0)\n"
        "fig, ax = plt.subplots(figsize=(8, 6), dpi=100)\n"
        "ax.imshow(rng.random((120, 160)), cmap='viridis')\n"
        "fig"
    )
    with anyio.fail_after(120):
        async with connect(KERNELBRIDGE_IMAGE_BUDGET="20000") as client:
            result = await run(client, code, session="plots")
            images = [b for b in result.content if b.type == "image"]
            links = [b for b in result.content if b.type == "resource_link"]
            assert result.is_error is False, text_of(result)
            assert len(images) == 1 and len(links) == 1, [b.type for b in result.content]
            original = await client.read_resource(links[0].uri)
            small = await run(
                client, "plt.close('all'); fig2, ax2 = plt.subplots(figsize=(1, 1)); fig2", session="plots"
            )
    assert len(images[0].data) <= 20_000
    full_width, full_height = _png_size(original.contents[0].blob)
    assert full_width >= 600 and len(original.contents[0].blob) > 20_000  # inline's tight bbox trims 800x600
    width, height = _png_size(images[0].data)
    assert width < full_width and abs(width / height - full_width / full_height) < 0.02
    assert (
        links[0].uri.startswith("kernelbridge://sessions/plots/outputs/")
        and links[0].mime_type == "image/png"
    )
    assert result.structured_content["note_codes"] == ["image_downscaled"]
    assert f"was {full_width}x{full_height}" in text_of(result) and links[0].uri in text_of(result)
    # Within the budget: sent as it is, no link.
    assert [b.type for b in small.content].count("image") == 1
    assert not [b for b in small.content if b.type == "resource_link"]
