"""Every failure a new user meets is one line with its cause and its fix, and settings do what the
README says. Real commands (the console script) and a real MCP client over stdio."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
CLI_TIMEOUT = 120


def kernelbridge(*args: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp / "state"), **env}
    return subprocess.run(
        [str(KERNELBRIDGE), *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=environ,
        cwd=tmp,
        check=False,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``kernelbridge: ...`` line a failing command printed."""
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kernelbridge: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_an_unusable_state_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    # `serve` over stdio starts all the same and says it at every call (test_bad_settings.py).
    for command in (["serve", "--http"], ["replay", "x.ipynb"]):
        line = one_line(kernelbridge(*command, tmp=tmp_path, KERNELBRIDGE_STATE_DIR=str(blocker / "state")))
        assert "state directory" in line and "KERNELBRIDGE_STATE_DIR" in line


def test_replay_of_json_that_is_not_a_notebook_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text(json.dumps({"rows": [1, 2, 3]}))
    line = one_line(kernelbridge("replay", "data.json", tmp=tmp_path))
    assert "data.json" in line and "notebook" in line


def test_a_docker_daemon_that_is_down_is_one_line(tmp_path: Path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("the docker CLI is not installed")
    down = {"KERNELBRIDGE_RUNTIME": "docker", "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    line = one_line(kernelbridge("image", "status", tmp=tmp_path, **down))
    assert "docker" in line.lower()
    doctor = kernelbridge("doctor", tmp=tmp_path, **down)
    assert doctor.returncode == 1
    assert any(line.startswith("FAIL  runtime") for line in doctor.stdout.splitlines()), doctor.stdout


def test_bad_settings_are_one_line(tmp_path: Path) -> None:
    cases = {
        "KERNELBRIDGE_ALLOW_UNLIMITED": ("maybe", "expected 1 or 0"),
        "KERNELBRIDGE_IMAGE_PACKAGES": ("-r /etc/passwd", "not a package requirement"),
        "KERNELBRIDGE_HTTP_TOKENS": ("short", "at least 16"),
    }
    for variable, (value, reason) in cases.items():
        # Over HTTP, so that a bridge that wrongly started would not end with stdin: the timeout fails.
        line = one_line(kernelbridge("serve", "--http", tmp=tmp_path, **{variable: value}))
        assert reason in line, line


# -- through MCP ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_image() -> Iterator[str]:
    """An image without kernelbridge labels (as `python:3.14-slim` would be), made here from a
    tiny tarball (no registry), removed afterwards."""
    tag = f"localhost/kernelbridge-test-plain:{uuid.uuid4().hex[:8]}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"plain\n"
        info = tarfile.TarInfo("etc/plain")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(
        ["podman", "import", "--change", 'CMD ["/bin/false"]', "-", tag],
        input=buffer.getvalue(),
        capture_output=True,
        timeout=CLI_TIMEOUT,
        check=True,
    )
    try:
        yield tag
    finally:
        subprocess.run(
            ["podman", "rmi", "--force", tag], capture_output=True, timeout=CLI_TIMEOUT, check=False
        )


@pytest.mark.podman
@pytest.mark.anyio
async def test_a_plain_image_gets_a_clear_message(connect, kb, plain_image: str) -> None:
    # The predecessor's variable names a plain image: the model and the operator get one line.
    async with connect(MCP_BRIDGE_IMAGE=plain_image) as client:
        result = await kb.run(client, "1 + 1")
    assert result.is_error
    text = kb.text_of(result)
    assert f"{plain_image} is not a kernelbridge sandbox image" in text
    assert "kernelbridge image build" in text and "\n" not in text.strip()


@pytest.mark.podman
@pytest.mark.anyio
async def test_a_missing_image_of_configured_packages_says_to_build_it(connect, kb) -> None:
    async with connect(KERNELBRIDGE_IMAGE_PACKAGES="kernelbridge-test-not-built") as client:
        result = await kb.run(client, "1 + 1")
    assert result.is_error
    assert "is missing; run `kernelbridge image build`" in kb.text_of(result)


@pytest.mark.anyio
async def test_a_daemon_that_is_down_reaches_the_model_as_one_line(connect, kb, tmp_path: Path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("the docker CLI is not installed")
    down = {"KERNELBRIDGE_RUNTIME": "docker-cli", "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    async with connect(**down) as client:
        result = await kb.run(client, "1 + 1")
        capabilities = await client.read_resource("kernelbridge://capabilities")
    assert result.is_error
    text = kb.text_of(result).strip()
    assert "Cannot connect to the Docker daemon" in text and "\n" not in text
    assert "status 125" not in text
    assert "Sandboxes cannot start right now" in capabilities.contents[0].text


@pytest.mark.podman
@pytest.mark.anyio
async def test_timeout_settings_are_the_tool_default(connect, kb) -> None:
    """KERNELBRIDGE_DEFAULT_TIMEOUT (and the predecessor's MCP_BRIDGE_TIMEOUT) become the default
    the tool schema shows and the one a call without ``timeout`` gets."""
    async with connect(MCP_BRIDGE_TIMEOUT="3") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["run_python"].input_schema["properties"]["timeout"]["default"] == 3
        result = await client.call_tool("run_python", {"code": "import time; time.sleep(30)"})
    assert result.structured_content["status"] == "timeout"
    assert "Timed out after 3 s" in kb.text_of(result), kb.text_of(result)  # the setting's 3 s, not 30
