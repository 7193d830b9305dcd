"""The Pod manifest of a sandbox runs: ``podman kube play`` starts it from ``kube.pod_manifest``,
the sandbox image runs a probe, and the limits and the read-only root hold.

``podman kube play`` runs pods without a cluster. It has no field for ulimits (nor has a Pod:
they are the node runtime's defaults), and podman's default nofile limit cannot be set without
CAP_SYS_RESOURCE here, so the test gives podman the node-level default a cluster operator would
(``default_ulimits`` in a containers.conf of its own). It plays with ``--network none``: a pod
network would make podman add a bridge to the host (the NetworkPolicy is the cluster's way).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from runtime_harness import LIMITS_PROBE, make_spec

from kernelbridge.runtime.flags import size_bytes
from kernelbridge.runtime.kube.manifest import CONTAINER_NAME, pod_manifest, to_yaml

pytestmark = [pytest.mark.podman]

PLAY_TIMEOUT = 120.0
"""`podman kube play` builds its pause image on first use (~5 s) and then starts a pod in ~1 s."""


def podman(*args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=PLAY_TIMEOUT, env=env, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed: {result.stderr.strip()[-2000:]}")
    return result.stdout


def test_pod_manifest_runs_under_podman_kube_play(tmp_path: Path, sandbox_image: str) -> None:
    # Stripped: podman 4.3's kube play rejects a string that starts with a newline ("did not find
    # expected '-' indicator").
    probe = LIMITS_PROBE.strip()
    spec = make_spec(sandbox_image, ("python3", "-c", probe), memory="200m", cpus=0.5, tmp_size="16m")
    manifest = pod_manifest(spec)
    pod = manifest["metadata"]["name"]
    volumes = [v["name"] for v in manifest["spec"]["volumes"]]
    (tmp_path / "pod.yaml").write_text(to_yaml(manifest))
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    sandbox = f"{pod}-{CONTAINER_NAME}"
    try:
        podman("kube", "play", "--network", "none", str(tmp_path / "pod.yaml"), env=env)
        deadline = time.monotonic() + PLAY_TIMEOUT
        while podman("inspect", "--format", "{{.State.Status}}", sandbox).strip() != "exited":
            assert time.monotonic() < deadline, f"{sandbox} did not finish"
            time.sleep(0.1)
        logs = podman("logs", sandbox)
        state = json.loads(podman("inspect", "--format", "{{json .State}}", sandbox))
    finally:
        podman("kube", "down", str(tmp_path / "pod.yaml"), check=False)
        podman("volume", "rm", "-f", *volumes, check=False)
    assert state["ExitCode"] == 0, logs
    seen = json.loads(logs)
    assert seen["uid"] == [65534, 65534]
    assert int(seen["memory"]) == size_bytes("200m")
    assert seen["cpu"] == "50000 100000"
    assert seen["root_read_only"] is True
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["interfaces"] == ["lo"]
    assert seen["cwd"] == "/workspace"
    assert seen["nofile"] == [1024, 1024]
    # Torn down: no pod, no container, no volume of ours is left.
    assert pod not in podman("pod", "ps", "--format", "{{.Name}}").split()
    assert sandbox not in podman("ps", "-a", "--format", "{{.Names}}").split()
    assert not set(volumes) & set(podman("volume", "ls", "--format", "{{.Name}}").split())
