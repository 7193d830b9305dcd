"""The built sandbox image, through podman: label, contents, and the agent's hello/ready handshake.

These tests never rebuild: ``ensure_image`` builds once (about a minute) if the image is missing or
stale, and reuses it afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from kernelbridge import image

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
    return image.ensure_image("podman", log=lambda line: None)


def test_image_is_current_and_labelled_with_the_agent_hash(tag: str) -> None:
    assert tag == image.default_image()
    assert image.image_status("podman", tag) == "current"
    labels = image.image_labels("podman", tag)
    assert labels is not None
    assert labels[image.HASH_LABEL] == image.agent_hash()
    assert image.image_status("podman", "localhost/kernelbridge-sandbox:latest") == "current"


def test_missing_image_is_reported_missing() -> None:
    assert image.image_status("podman", "localhost/kernelbridge-sandbox:no-such-tag") == "missing"


def test_image_contents(tag: str) -> None:
    script = (
        "import json, pathlib, ipykernel, numpy, pandas, matplotlib, PIL;"
        "import kernelbridge.inside.agent.host_link as agent;"
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
