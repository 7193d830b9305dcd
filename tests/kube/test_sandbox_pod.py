"""A sandbox pod on the kube tier's cluster gets the sandbox's limits and hardening.

What the Pod spec carries (``pod_manifest``: user, memory and cpu, read-only root, no
capabilities, no privilege escalation, seccomp) and what only the node can set, which
``kube-cluster.sh`` configures to the sandbox defaults (``SandboxLimits``): the pids limit
(the kubelet's ``podPidsLimit``, on the pod's cgroup) and the nofile/nproc ulimits (containerd's
base spec). Read from inside the pod, the pids limit from the node's cgroup of the pod.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
from kube_harness import SANDBOX_NAMESPACE, TEST_RUN_LABEL, Cluster

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.flags import size_bytes
from kernelbridge.runtime.kube.manifest import pod_manifest

pytestmark = [pytest.mark.podman, pytest.mark.slow]

START_TIMEOUT = 120.0
CGROUP_ROOT = Path("/sys/fs/cgroup/pids/kernelbridge-kube")
"""The kubelet's cgroup root on this node (``kube-cluster.sh``: cgroupfs, cgroup v1)."""

PROBE = r"""
import json, os, resource, sys
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
try:
    open("/etc/kernelbridge-probe", "w")
    root_read_only = False
except OSError:
    root_read_only = True
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print(json.dumps({
    "uid": [os.getuid(), os.getgid()],
    "memory": read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "cpu": [read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")],
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "nproc": resource.getrlimit(resource.RLIMIT_NPROC),
    "root_read_only": root_read_only,
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(), "cwd": os.getcwd(),
}), flush=True)
sys.stdin.read()  # until the test has read the pod's cgroup: its stdin closes when it is deleted
"""


def test_a_sandbox_pod_has_the_sandboxs_limits(kube_cluster: Cluster, sandbox_image: str) -> None:
    limits = SandboxLimits()
    spec = ContainerSpec(
        image=sandbox_image,
        name=f"kbtest-{secrets.token_hex(4)}",
        session="kube-limits",
        owner_pid=os.getpid(),
        limits=limits,
        command=("python3", "-c", PROBE),
        labels=((TEST_RUN_LABEL, kube_cluster.run_label.split("=", 1)[1]),),
    )
    manifest = pod_manifest(spec, namespace=SANDBOX_NAMESPACE)
    name = manifest["metadata"]["name"]
    try:
        kube_cluster.apply(manifest)
        pod = kube_cluster.wait_for_phase(name, "Running", START_TIMEOUT)
        seen = kube_cluster.wait_for_log_line(name, START_TIMEOUT)
        pids_max = (CGROUP_ROOT / "kubepods" / f"pod{pod['metadata']['uid']}" / "pids.max").read_text()
    finally:
        kube_cluster.kubectl("-n", SANDBOX_NAMESPACE, "delete", "pod", name, "--grace-period=1")
    verdict = json.loads(seen)
    assert verdict["uid"] == [65534, 65534]
    assert int(verdict["memory"]) == size_bytes(limits.memory)
    assert verdict["cpu"] == [str(int(limits.cpus * 100000)), "100000"]
    assert verdict["root_read_only"] is True and verdict["cwd"] == "/workspace"
    assert verdict["cap_eff"] == "0000000000000000" and verdict["no_new_privs"] == "1"
    assert verdict["seccomp"] == "2"  # filter mode: RuntimeDefault
    assert verdict["nofile"] == [limits.nofile, limits.nofile]
    assert verdict["nproc"] == [limits.nproc, limits.nproc]
    assert int(pids_max) == limits.pids
