"""What the kube tier's tests share: the cluster (``scripts/kube-cluster.sh``) through its own
kubectl, started once per run (:func:`cluster_for_run`, the ``kube_cluster`` fixture of
``tests/conftest.py``, for every suite with kube tests), and the check that a stopped cluster
left no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernelbridge.runtime.kube.manifest import to_yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "kube-cluster.sh"
SANDBOX_NAMESPACE = "kernelbridge"
"""The namespace `kube-cluster.sh up` makes for sandboxes (Pod Security ``restricted``)."""
UP_TIMEOUT = 900.0
"""`up` imports the sandbox image (~1 GB) the first time; later starts take seconds."""
KUBECTL_TIMEOUT = 120.0
TEST_RUN_LABEL = "kernelbridge.test-run"


def script(*args: str, timeout: float = KUBECTL_TIMEOUT, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kube-cluster.sh {' '.join(args[:3])} failed: {result.stderr.strip()[-3000:]}")
    return result.stdout


@dataclass(frozen=True)
class Cluster:
    """The running cluster, through its own kubectl."""

    kubeconfig: Path
    run_label: str
    """``kernelbridge.test-run=<run>``: on every pod this test run creates."""

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = KUBECTL_TIMEOUT) -> str:
        result = subprocess.run(
            [str(SCRIPT), "kubectl", *args], input=stdin, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)}: {result.stderr.strip()[-2000:]}")
        return result.stdout

    def apply(self, *documents: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=to_yaml(*documents))

    def get(self, kind: str, name: str, namespace: str = SANDBOX_NAMESPACE) -> dict[str, Any]:
        return json.loads(self.kubectl("-n", namespace, "get", kind, name, "-o", "json"))  # type: ignore[no-any-return]

    def wait_for_phase(
        self, pod: str, phase: str, timeout: float = KUBECTL_TIMEOUT, namespace: str = SANDBOX_NAMESPACE
    ) -> dict[str, Any]:
        """The pod once its phase is ``phase``; fails early on any other final phase, and says
        what the pod's events said when it never gets there."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.get("pod", pod, namespace)
            current = seen.get("status", {}).get("phase")
            if current == phase:
                return seen
            if current in ("Succeeded", "Failed"):
                raise AssertionError(f"pod {pod} ended {current}: {seen.get('status')}")
            if time.monotonic() > deadline:
                events = self.kubectl(
                    "-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={pod}"
                )
                raise AssertionError(
                    f"pod {pod} not {phase} after {timeout}s: {seen.get('status')}\n{events}"
                )
            time.sleep(0.2)

    def logs(self, pod: str, namespace: str = SANDBOX_NAMESPACE) -> str:
        return self.kubectl("-n", namespace, "logs", pod)

    def wait_for_log_line(self, pod: str, timeout: float = KUBECTL_TIMEOUT) -> str:
        """The first line a running pod writes."""
        deadline = time.monotonic() + timeout
        while not (lines := self.logs(pod).splitlines()):
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {pod} wrote nothing in {timeout}s")
            time.sleep(0.2)
        return lines[0]

    def run_pods(self) -> list[str]:
        out = self.kubectl("get", "pods", "--all-namespaces", "-l", self.run_label, "-o", "name")
        return out.split()


class KubectlError(AssertionError):
    pass


def cluster_processes(directory: str) -> list[str]:
    """Processes whose command line names the cluster's directory (its daemons, containerd's
    shims): none may be left once it is down."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if directory in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def cluster_for_run(sandbox_image: str, run: str, *, also: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """The cluster for this run (``up`` once; ``down`` after when it was not running before); every
    pod labelled with the run (``run``, or one of ``also``: the runtime suite labels by pid) is
    deleted afterwards, and none may be left. Skips with one line when the binaries are not built."""
    if os.geteuid() != 0:
        pytest.skip("the kube tier runs a kubelet and containerd: root only")
    if subprocess.run([str(SCRIPT), "built"], check=False, timeout=60).returncode != 0:
        pytest.skip("the Kubernetes binaries are not built: `make test-kube` builds them and runs this tier")
    was_up = (
        subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False, timeout=60).returncode == 0
    )
    try:
        out = script("up", timeout=UP_TIMEOUT, env={"KERNELBRIDGE_KUBE_IMAGE": sandbox_image})
    except BaseException:
        if not was_up:  # a start that failed half-way still stops what it started
            script("down", timeout=UP_TIMEOUT)
        raise
    last = out.strip().splitlines()[-1]
    assert last.startswith("KUBECONFIG="), out
    kubeconfig = Path(last.removeprefix("KUBECONFIG="))
    cluster = Cluster(kubeconfig=kubeconfig, run_label=f"{TEST_RUN_LABEL}={run}")
    selector = f"{TEST_RUN_LABEL} in ({','.join((run, *also))})"
    try:
        yield cluster
    finally:
        try:
            cluster.kubectl(
                "delete", "pods", "--all-namespaces", "-l", selector, "--grace-period=1", "--wait=true"
            )
            left = cluster.kubectl("get", "pods", "--all-namespaces", "-l", selector, "-o", "name").split()
        finally:
            if not was_up:
                script("down", timeout=UP_TIMEOUT)
        if not was_up:
            assert not cluster_processes(str(kubeconfig.parent)), "processes left by kube-cluster.sh down"
        assert not left, f"pods left behind: {left}"
