"""Bad input on Kubernetes: each gives one clear line and a usable bridge, never a hang.

A cluster that does not answer, credentials without rights, a namespace that does not exist:
the bridge starts all the same (``tools/list`` answers) and every ``run_python`` says the one
line. A sandbox image recorded but missing on the node (``ErrImageNeverPull``): the backend says
so and removes the pod. (A Lease held by a dead bridge and a pod evicted mid-cell are in
``test_durable_pods.py``.)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge
from kube_harness import SANDBOX_NAMESPACE, TEST_RUN_LABEL, Cluster
from waiting import hang_guard

from kernelbridge.config import load_settings
from kernelbridge.errors import ImageError
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.kube import open_kube

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

BOUND = 60.0
"""A bad cluster is said within this (an unreachable one: the connect timeout, 10 s)."""


def kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', certificate-authority: '{ca}'}}}}]\n"
        f"users: [{{name: u, user: {{client-certificate: '{cert}', client-key: '{key}'}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return path


def nobody_credentials(cluster: Cluster, directory: Path) -> tuple[Path, Path, Path]:
    """A client certificate the cluster's CA signed for a user that no Role names."""
    pki = cluster.kubeconfig.parent / "pki"
    key, csr, cert = directory / "nobody.key", directory / "nobody.csr", directory / "nobody.crt"
    subprocess.run(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", "/CN=kbtest-nobody",
         "-out", str(csr)], check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"),
         "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-CAserial", str(directory / "ca.srl"),
         "-days", "1", "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return pki / "ca.crt", cert, key


async def said_by_a_bridge(state: Path, env: dict[str, str]) -> str:
    """What the first ``run_python`` of a bridge with ``env`` says; the bridge answers tools/list."""
    async with open_bridge(state, **env) as bridge:
        with hang_guard(BOUND, "a bridge's first calls to a bad cluster"):
            tools = await bridge.client.list_tools()
            assert "run_python" in {tool.name for tool in tools.tools}, "the bridge serves"
            error, text = await bridge.call("run_python", code="print(1)", session="s")
        assert error, text
        again, text_again = await bridge.call("run_python", code="print(2)", session="t")
        assert again, text_again
    line = text.strip()
    assert "\n" not in line and "Traceback" not in line, line
    return line


async def test_a_cluster_that_does_not_answer(tmp_path: Path, kube_cluster: Cluster) -> None:
    # The node's own address, a port nothing listens on: refused at once, nothing leaves the host.
    ca, cert, key = (
        kube_cluster.kubeconfig.parent / "pki" / f"{n}" for n in ("ca.crt", "admin.crt", "admin.key")
    )
    config = kubeconfig(tmp_path / "kubeconfig", "https://198.18.255.1:1", ca, cert, key)
    line = await said_by_a_bridge(
        tmp_path / "state", {"KERNELBRIDGE_RUNTIME": "kube", "KUBECONFIG": str(config)}
    )
    assert "cannot reach the Kubernetes API server at https://198.18.255.1:1" in line, line


async def test_credentials_without_rights(tmp_path: Path, kube_cluster: Cluster) -> None:
    config = kubeconfig(
        tmp_path / "kubeconfig", "https://198.18.255.1:16443", *nobody_credentials(kube_cluster, tmp_path)
    )
    line = await said_by_a_bridge(
        tmp_path / "state", {"KERNELBRIDGE_RUNTIME": "kube", "KUBECONFIG": str(config)}
    )
    assert "forbidden" in line and "lack this right" in line and "kbtest-nobody" in line, line


async def test_a_namespace_that_does_not_exist(tmp_path: Path, kube_cluster: Cluster) -> None:
    env = {
        "KERNELBRIDGE_RUNTIME": "kube",
        "KUBECONFIG": str(kube_cluster.kubeconfig),
        "KERNELBRIDGE_KUBE_NAMESPACE": "kbtest-no-such-namespace",
    }
    line = await said_by_a_bridge(tmp_path / "state", env)
    assert "the namespace 'kbtest-no-such-namespace' does not exist" in line, line


async def test_an_image_recorded_but_missing_on_the_node_is_an_image_error(
    kube_cluster: Cluster, sandbox_image: str
) -> None:
    """``ErrImageNeverPull``: the records say the image exists, the node does not have it."""
    settings = load_settings({"KERNELBRIDGE_RUNTIME": "kube", "KUBECONFIG": str(kube_cluster.kubeconfig)})
    missing = f"localhost/kbtest-{os.getpid()}:never-loaded"
    async with await open_kube(settings) as runtime:
        await runtime.images.record(missing, {"kernelbridge.agent-hash": "x"})
        try:
            with anyio.fail_after(BOUND):
                spec = ContainerSpec(
                    image=missing,
                    name=f"kbtest-{os.getpid()}-never",
                    session="kube-bad",
                    owner_pid=os.getpid(),
                    command=("cat",),
                    labels=((TEST_RUN_LABEL, str(os.getpid())),),
                )
                name = await runtime.create(spec)
                with pytest.raises(ImageError, match=r"missing on the node \(ErrImageNeverPull\)"):
                    await runtime.attach(name)
                assert await runtime.inspect(name) is None, "the pod that cannot start is removed"
        finally:
            await runtime.images.remove(missing)
    assert not kube_cluster.kubectl(
        "-n", SANDBOX_NAMESPACE, "get", "pods", "-l", f"kernelbridge.test-run={os.getpid()}", "-o", "name"
    ).split()
