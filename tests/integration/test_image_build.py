"""The built sandbox image, through podman: label, contents, and the agent's hello/ready handshake.

These tests never rebuild: ``ensure_sandbox_image`` builds once (about a minute) if the image is
missing or stale, and reuses it afterwards. Its labels and status are read through the image
store of each podman backend (API and CLI), as ``kernelbridge image status`` and the bridge read them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from kernelbridge import image
from kernelbridge.config import load_settings
from kernelbridge.runtime import open_runtime
from kernelbridge.testing import ensure_sandbox_image

pytestmark = [
    pytest.mark.podman,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]

# The minimum the sandbox needs to start here: the host's default ulimits would be raised past what
# a process without CAP_SYS_RESOURCE may set (see DESIGN.md, "Sandbox container").
RUN = [
    "podman", "run", "--rm", "--network", "none", "--read-only", "--user", "65534:65534",
    "--tmpfs", "/tmp:size=64m", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
    "--log-driver", "passthrough",
]  # fmt: skip
# Bounds a container run: start plus a kernel's start take about a second here.
RUN_TIMEOUT = 60


@pytest.fixture(scope="module")
def tag() -> str:
    return ensure_sandbox_image()


def store_view(runtime: str, tag: str, state: Path) -> tuple[str, str, str, dict[str, str] | None]:
    """(status of ``tag``, of ``:latest``, of a tag that does not exist, ``tag``'s labels), as the
    image store of ``runtime`` reports them."""

    async def ask() -> tuple[str, str, str, dict[str, str] | None]:
        settings = load_settings({"KERNELBRIDGE_RUNTIME": runtime, "KERNELBRIDGE_STATE_DIR": str(state)})
        async with open_runtime(settings) as backend:
            store = backend.images
            return (
                await image.image_status(store, tag),
                await image.image_status(store, f"{image.REPOSITORY}:latest"),
                await image.image_status(store, f"{image.REPOSITORY}:no-such-tag"),
                await store.labels(tag),
            )

    return anyio.run(ask)


@pytest.mark.parametrize("runtime", ["podman-api", "podman-cli"])
def test_image_is_current_and_labelled_with_the_agent_hash(tag: str, runtime: str, tmp_path: Path) -> None:
    assert tag == image.default_image()
    status, latest, missing, labels = store_view(runtime, tag, tmp_path / "state")
    assert (status, latest, missing) == ("current", "current", "missing")
    assert labels is not None
    assert labels[image.HASH_LABEL] == image.agent_hash()
    assert labels[image.IMAGE_HASH_LABEL] == image.image_hash()


def test_image_contents(tag: str) -> None:
    script = (
        "import json, pathlib, ipykernel, numpy, pandas, matplotlib, PIL;"
        "import kernelbridge.inside.agent.hello as agent;"
        "print(json.dumps({'ipykernel': ipykernel.__version__,"
        " 'hash': agent.AGENT_HASH_FILE.read_text().strip(),"
        " 'cached': any(pathlib.Path(ipykernel.__file__).parent.glob('__pycache__/*.cpython-311.pyc'))}))"
    )
    proc = subprocess.run(
        [*RUN, tag, "python3", "-c", script], capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert int(found["ipykernel"].split(".")[0]) >= 7
    assert found["hash"] == image.agent_hash()
    assert found["cached"], "bytecode was not pre-compiled: every kernel start would recompile"


def test_image_runs_the_agent(tag: str) -> None:
    hello = json.dumps({"type": "hello", "key": "k", "session": "t", "agent_hash": image.agent_hash()})
    proc = subprocess.Popen(
        [*RUN, "-i", tag], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(hello.encode() + b"\n")
        proc.stdin.flush()
        # readline has no timeout of its own; the container is killed in `finally` if it hangs,
        # and pytest-timeout bounds the test.
        line = proc.stdout.readline()
        frame = json.loads(line)
        assert frame["type"] == "ready", line
        assert frame["agent_hash"] == image.agent_hash()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
