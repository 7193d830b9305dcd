"""kernelbridge kernels under the kernel managers Jupyter applications use, with the connection
directories they use: MultiKernelManager (jupyter_client), AsyncMappingKernelManager
(jupyter_server, what JupyterLab runs), and `jupyter run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client import MultiKernelManager

pytestmark = pytest.mark.podman

READY_TIMEOUT = 120


@pytest.mark.parametrize("connection_dir", ["", "relative-dir", "ABSOLUTE"])
def test_multi_kernel_manager_runs_a_sandboxed_kernel(
    jupyter_env: dict[str, str], tmp_path: Path, connection_dir: str
) -> None:
    if connection_dir == "ABSOLUTE":
        connection_dir = str(tmp_path / "absolute-dir")
    if connection_dir:
        Path(connection_dir).mkdir()  # jupyter_client does not create it (not for python3 either)
    manager = MultiKernelManager(connection_dir=connection_dir)
    kernel_id = manager.start_kernel(kernel_name="kernelbridge")
    try:
        km = manager.get_kernel(kernel_id)
        client = km.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=READY_TIMEOUT)
            outputs: list[str] = []
            reply = client.execute_interactive(
                "import os; print(6 * 7, os.getuid())",
                timeout=60,
                output_hook=lambda msg: outputs.append(msg["content"].get("text", "")),
            )
        finally:
            client.stop_channels()
        assert reply["content"]["status"] == "ok"
        assert "".join(outputs) == "42 65534\n"
    finally:
        manager.shutdown_all(now=False)
    assert manager.list_kernel_ids() == []


@pytest.mark.anyio
async def test_jupyter_server_mapping_kernel_manager(jupyter_env: dict[str, str], tmp_path: Path) -> None:
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    (tmp_path / "kernels").mkdir()
    manager = AsyncMappingKernelManager(connection_dir="kernels", root_dir=str(tmp_path))
    kernel_id = await manager.start_kernel(kernel_name="kernelbridge")
    try:
        km = manager.get_kernel(kernel_id)
        assert Path(km.connection_file).is_absolute()
        client = km.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=READY_TIMEOUT)
            reply = await client.execute_interactive("x = 6 * 7", timeout=60)
            assert reply["content"]["status"] == "ok"
            # A restart keeps the sandbox usable (jupyter_server's restart button).
            await manager.restart_kernel(kernel_id)
            await client.wait_for_ready(timeout=READY_TIMEOUT)
            reply = await client.execute_interactive("print('after restart')", timeout=60)
            assert reply["content"]["status"] == "ok"
        finally:
            client.stop_channels()
    finally:
        await manager.shutdown_kernel(kernel_id)


def test_jupyter_run_exits_cleanly(jupyter_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "cell.py"
    script.write_text("print(6 * 7)\n")
    jupyter = Path(sys.executable).with_name("jupyter")
    proc = subprocess.run(
        [str(jupyter), "run", "--kernel=kernelbridge", str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **jupyter_env},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"
    assert "Traceback" not in proc.stderr, proc.stderr


def test_a_kernel_port_taken_before_the_tunnel_binds_it_is_picked_again(jupyter_env: dict[str, str]) -> None:
    """jupyter_client picks free ports and hands them over; another process may take one first
    (a busy host, parallel test workers). The provisioner picks new ones and starts again."""
    import socket

    from jupyter_client import KernelManager

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        km = KernelManager(kernel_name="kernelbridge", cache_ports=False)
        km.shell_port = busy  # as if it was free when jupyter_client looked
        km.start_kernel()
        try:
            assert km.shell_port != busy
            client = km.client()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=READY_TIMEOUT)
                reply = client.execute_interactive("6 * 7", timeout=60)
            finally:
                client.stop_channels()
            assert reply["content"]["status"] == "ok"
        finally:
            km.shutdown_kernel(now=False)
