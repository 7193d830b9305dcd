"""`kernelbridge serve --http`: streamable HTTP on 127.0.0.1, driven by the SDK's HTTP client."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from bridge_harness import free_port, uses_state_dir
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")


async def wait_listening(port: int, proc: Process) -> None:
    with anyio.fail_after(30):
        while True:
            assert proc.returncode is None, "kernelbridge serve --http exited"
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.1)
                continue
            await stream.aclose()
            return


async def test_run_python_over_streamable_http(tmp_path: Path, sandbox_image: str) -> None:
    port = free_port()
    token = "only-me-0123456789abcdef"
    env = {
        **os.environ,
        "KERNELBRIDGE_STATE_DIR": str(uses_state_dir(tmp_path / "state")),
        "KERNELBRIDGE_HTTP_TOKENS": f"me:{token}",
    }
    argv = [str(KERNELBRIDGE), "serve", "--http", "--port", str(port)]
    async with await anyio.open_process(argv, env=env, stdin=None, stdout=None, stderr=None) as proc:
        try:
            await wait_listening(port, proc)
            http = create_mcp_http_client(headers={"authorization": f"Bearer {token}"})
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
            async with Client(transport, read_timeout_seconds=120) as client:
                first = await client.call_tool("run_python", {"code": "x = 6 * 7", "session": "web"})
                second = await client.call_tool("run_python", {"code": "x", "session": "web"})
            assert not first.is_error
            assert second.structured_content["result"] == "42"
            assert second.structured_content["state"] == "kept"
        finally:
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                assert await proc.wait() == 0
