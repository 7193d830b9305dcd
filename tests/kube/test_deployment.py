"""The bridge in the cluster: ``deploy/kubernetes/`` (its ``dev-cluster`` overlay) applied into a
namespace of the test's own, the bridge's image built by ``scripts/bridge-image.sh`` and loaded
onto the node, a real MCP client over streamable HTTP through ``kubectl port-forward``. A session
made through the first bridge pod is adopted by the Deployment's next pod once the first is
deleted (``state: kept``); then every object is deleted and no pod is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import CLIENT_TIMEOUT, Bridge
from kube_harness import REPO, SANDBOX_NAMESPACE, SCRIPT, Cluster
from mcp.client.client import Client

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.slow, pytest.mark.timeout(1200)]

NAMESPACE = "kernelbridge-deploy-test"
"""The test's own namespace (the bridge and its sandboxes): not the tier's sandbox namespace."""
OVERLAY = REPO / "deploy" / "kubernetes" / "dev-cluster"
BRIDGE_UID = 10001
IMAGE_BUILD_TIMEOUT = 900.0
WAIT = 180.0
BRIDGE_SELECTOR = "app.kubernetes.io/component=bridge"


@pytest.fixture(scope="module")
def bridge_image(kube_cluster: Cluster) -> str:
    """The bridge's image of this checkout (built when missing), loaded onto the node."""
    done = subprocess.run(
        [str(REPO / "scripts" / "bridge-image.sh"), "--import"],
        capture_output=True,
        text=True,
        timeout=IMAGE_BUILD_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stderr.strip().splitlines()[-2] if done.stderr.strip() else "")
    return done.stdout.strip().splitlines()[-1]


def overlay(where: Path, image: str, state: Path, token: str, cluster: Cluster) -> Path:
    """A kustomization of the test's own over the dev-cluster overlay: its namespace, the image
    just built, the state directory on a host directory of the test, the tokens Secret and the
    sandbox image's record (copied from the tier's sandbox namespace, where ``up`` wrote it)."""
    where.mkdir()
    records = cluster.get("configmap", "kernelbridge-images", SANDBOX_NAMESPACE)
    images = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kernelbridge-images"}}
    (where / "images.json").write_text(json.dumps({**images, "data": records.get("data") or {}}))
    secret = where / "tokens.json"
    secret.touch(mode=0o600)
    tokens = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kernelbridge-tokens"}}
    secret.write_text(json.dumps({**tokens, "stringData": {"tokens": f"alice:{token}"}}))
    name, _, tag = image.rpartition(":")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": [os.path.relpath(OVERLAY, where), "images.json", "tokens.json"],
        "images": [{"name": "localhost/kernelbridge-bridge", "newName": name, "newTag": tag}],
        "patches": [
            {
                "target": {"kind": "PersistentVolume", "name": "kernelbridge-state"},
                "patch": json.dumps([{"op": "replace", "path": "/spec/hostPath/path", "value": str(state)}]),
            }
        ],
    }
    (where / "kustomization.yaml").write_text(json.dumps(kustomization))
    return where


def bridge_pods(cluster: Cluster) -> list[dict[str, object]]:
    found = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l", BRIDGE_SELECTOR, "-o", "json"))
    return list(found["items"])


def ready(pod: dict[str, object]) -> bool:
    status = pod.get("status") or {}
    assert isinstance(status, dict)
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def ready_bridge_pod(cluster: Cluster, other_than: str = "") -> str:
    """The name of the Deployment's pod once it is Ready (not ``other_than``)."""
    deadline = time.monotonic() + WAIT
    while True:
        pods = bridge_pods(cluster)
        for pod in pods:
            meta = pod["metadata"]
            assert isinstance(meta, dict)
            if meta["name"] != other_than and not meta.get("deletionTimestamp") and ready(pod):
                return str(meta["name"])
        if time.monotonic() > deadline:
            events = cluster.kubectl("-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp")
            logs = ""
            for pod in pods:
                with contextlib.suppress(AssertionError):
                    logs += cluster.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"])  # type: ignore[index]
            raise AssertionError(f"no Ready bridge pod in {WAIT:g} s\n{events}\n{logs[-3000:]}")
        await anyio.sleep(0.5)


@contextlib.asynccontextmanager
async def client_of(pod: str, token: str) -> AsyncIterator[Bridge]:
    """An MCP client over streamable HTTP to ``pod``, through ``kubectl port-forward`` on a
    loopback port that kubectl picks."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    forward_to = ("port-forward", "--address", "127.0.0.1", f"pod/{pod}", ":8765")
    argv = [str(SCRIPT), "kubectl", "-n", NAMESPACE, *forward_to]
    async with await anyio.open_process(argv, stdin=subprocess.DEVNULL) as forward:
        try:
            assert forward.stdout is not None
            with anyio.fail_after(60):
                said = b""
                while b"\n" not in said:
                    chunk = await forward.stdout.receive()
                    said += chunk
            # "Forwarding from 127.0.0.1:PORT -> 8765"
            line = said.decode().splitlines()[0]
            assert line.startswith("Forwarding from 127.0.0.1:"), line
            port = int(line.split("127.0.0.1:", 1)[1].split()[0])
            http = create_mcp_http_client(headers={"authorization": f"Bearer {token}"})
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
            async with Client(transport, read_timeout_seconds=CLIENT_TIMEOUT) as client:
                yield Bridge(client, Path("/nonexistent"), 0)
        finally:
            forward.terminate()
            with anyio.fail_after(30):
                await forward.wait()


@pytest.fixture
def deployed(tmp_path: Path, bridge_image: str, kube_cluster: Cluster) -> Iterator[str]:
    """The manifests applied into :data:`NAMESPACE`; yields the token. Afterwards every object is
    deleted (the namespace, with its pods, and the PersistentVolume), and no pod may be left."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, BRIDGE_UID, BRIDGE_UID)  # the bridge's uid: a hostPath volume is not chowned
    token = secrets.token_urlsafe(24)
    where = overlay(tmp_path / "kustomize", bridge_image, state, token, kube_cluster)
    kube_cluster.kubectl("apply", "-k", str(where))
    try:
        yield token
    finally:
        kube_cluster.kubectl("delete", "-k", str(where), "--wait=true", "--ignore-not-found", timeout=300)
        left = kube_cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name").split()
        namespaces = kube_cluster.kubectl("get", "namespaces", "-o", "name").split()
        assert not left, f"pods left behind: {left}"
        assert f"namespace/{NAMESPACE}" not in namespaces, "the test namespace is still there"


async def test_the_deployments_next_pod_adopts_a_session_of_a_deleted_bridge_pod(
    deployed: str, kube_cluster: Cluster
) -> None:
    token = deployed
    first = await ready_bridge_pod(kube_cluster)
    async with client_of(first, token) as bridge:
        made = await bridge.run("x = 1\nprint('made')", "s")
        assert made.status == "ok" and made.stdout == "made\n", made.text
        sandbox = await bridge.container("s")
    sandboxes = kube_cluster.kubectl(
        "-n", NAMESPACE, "get", "pods", "-l", "kernelbridge.sandbox=true", "-o", "name"
    )
    assert f"pod/{sandbox}" in sandboxes.split(), sandboxes

    deleted = time.monotonic()
    kube_cluster.kubectl("-n", NAMESPACE, "delete", "pod", first, "--wait=false")
    second = await ready_bridge_pod(kube_cluster, other_than=first)
    async with client_of(second, token) as bridge:
        again = await bridge.run("print(x)", "s")
        adopted = time.monotonic() - deleted
        assert again.status == "ok" and again.stdout == "1\n", again.text
        assert again.data["state"] == "kept" and "adopted" in again.codes, again.text
        assert await bridge.container("s") == sandbox
        print(f"pod deletion to the adopting call's answer: {adopted:.1f} s")
        await bridge.close("s")
    assert first not in [p["metadata"]["name"] for p in bridge_pods(kube_cluster)]  # type: ignore[index]
