"""Sandbox pods on the kube tier's cluster reach nothing but their own loopback.

A pod from the sandbox image, with the sandbox's own manifest (``pod_manifest``: its
securityContext, its limits), runs a probe that tries every way out: another pod's address, the
node's address (API server, kubelet, a listener the test puts there), the ``kubernetes`` Service's
ClusterIP, DNS, and a server bound to the host's loopback. Each attempt must fail and each
listener must count no hit, while a connection to the pod's own loopback works. The cluster's
network has no policy controller; the isolation is the pod network itself (a private macvlan on a
bridge with no ports, no routes: docs/kubernetes.md), so the NetworkPolicy is not what is tested.
Only loopback and the cluster's own 198.18.0.0/15 addresses are targeted.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from kube_harness import SANDBOX_NAMESPACE, TEST_RUN_LABEL, Cluster, KubectlError
from listeners import CountingListener

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.kube.manifest import pod_manifest

pytestmark = [pytest.mark.podman, pytest.mark.slow]

START_TIMEOUT = 120.0

PROBE = r"""
import errno, json, socket, sys
def attempt(kind, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        if kind == "tcp":
            s.connect((host, port))
            return "connected"
        s.sendto(b"x" * 64, (host, port))
        return "sent"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
    finally:
        s.close()
def own_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=3) as client:
            peer, _ = server.accept()
            client.sendall(b"ping")
            with peer:
                return peer.recv(4).decode()
def resolve(name):
    try:
        return [a[4][0] for a in socket.getaddrinfo(name, 443)]
    except socket.gaierror as exc:
        return "gaierror"
routes = [line.split()[1] for line in open("/proc/net/route").read().splitlines()[1:]]
print(json.dumps({
    "results": [[*t, attempt(*t)] for t in json.loads(sys.argv[1])],
    "own_loopback": own_loopback(),
    "dns": {name: resolve(name) for name in json.loads(sys.argv[2])},
    "interfaces": [name for _, name in socket.if_nameindex()],
    "route_destinations": sorted(socket.inet_ntoa(bytes.fromhex(d)[::-1]) for d in routes),
}))
"""

LISTEN = r"""
import socket, sys, threading
port = int(sys.argv[1])
tcp = socket.socket(); tcp.bind(("0.0.0.0", port)); tcp.listen(16)
udp = socket.socket(type=socket.SOCK_DGRAM); udp.bind(("0.0.0.0", port))
def count(accept):
    while True:
        accept()
        print("hit", flush=True)
threading.Thread(target=count, args=(lambda: udp.recvfrom(65536),), daemon=True).start()
print("listening", flush=True)
count(lambda: tcp.accept()[0].close())
"""

HOST_LISTENER = r"""
import select, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
tcp = socket.socket(); tcp.bind((host, port)); tcp.listen(16)
udp = socket.socket(type=socket.SOCK_DGRAM); udp.bind((host, port))
print("listening", flush=True)
hits = 0
while True:
    ready = select.select([tcp, udp, sys.stdin], [], [])[0]
    if sys.stdin in ready:
        break
    for sock in ready:
        tcp.accept()[0].close() if sock is tcp else udp.recvfrom(65536)
        hits += 1
print("hits", hits, flush=True)
"""


def sandbox_pod(cluster: Cluster, image: str, command: tuple[str, ...], **limits: Any) -> dict[str, Any]:
    run = cluster.run_label.split("=", 1)[1]
    spec = ContainerSpec(
        image=image,
        name=f"kbtest-{secrets.token_hex(4)}",
        session="kube-no-network",
        owner_pid=os.getpid(),
        limits=SandboxLimits(**limits),
        command=command,
        labels=((TEST_RUN_LABEL, run),),
    )
    return pod_manifest(spec, namespace=SANDBOX_NAMESPACE)


class HostListener(CountingListener):
    """TCP and UDP on one host address and a free port (``port``)."""

    def __init__(self, host: str) -> None:
        with socket.socket() as probe:
            probe.bind((host, 0))
            self.port = int(probe.getsockname()[1])
        super().__init__(HOST_LISTENER, host, str(self.port))


@pytest.fixture
def listener_pod(kube_cluster: Cluster, sandbox_image: str) -> Iterator[tuple[str, str, int]]:
    """A sandbox pod listening on TCP and UDP on all its addresses: (name, pod IP, port)."""
    port = 8765
    # A quarter of a core: the node has two, and the probe pod takes its default of one.
    manifest = sandbox_pod(kube_cluster, sandbox_image, ("python3", "-c", LISTEN, str(port)), cpus=0.25)
    name = manifest["metadata"]["name"]
    kube_cluster.apply(manifest)
    try:
        pod = kube_cluster.wait_for_phase(name, "Running", START_TIMEOUT)
        yield name, pod["status"]["podIP"], port
    finally:
        kube_cluster.kubectl("-n", SANDBOX_NAMESPACE, "delete", "pod", name, "--grace-period=1")


def api_server(cluster: Cluster) -> tuple[str, int]:
    """Where the API server serves: the endpoint of the ``kubernetes`` Service."""
    endpoints = cluster.get("endpointslice", "kubernetes", namespace="default")
    return endpoints["endpoints"][0]["addresses"][0], int(endpoints["ports"][0]["port"])


def test_a_sandbox_pod_reaches_nothing_but_its_own_loopback(
    kube_cluster: Cluster, sandbox_image: str, listener_pod: tuple[str, str, int]
) -> None:
    node = kube_cluster.get("node", "kernelbridge-node", namespace="default")
    node_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    kubelet_port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    service_ip = kube_cluster.get("service", "kubernetes", namespace="default")["spec"]["clusterIP"]
    api_host, api_port = api_server(kube_cluster)
    other_pod, other_ip, other_port = listener_pod
    on_node, on_loopback = HostListener(node_ip), HostListener("127.0.0.1")
    targets = [
        ("tcp", other_ip, other_port),
        ("udp", other_ip, other_port),
        ("tcp", api_host, api_port),
        ("tcp", node_ip, kubelet_port),
        ("tcp", node_ip, on_node.port),
        ("udp", node_ip, on_node.port),
        ("tcp", service_ip, 443),
        ("udp", service_ip, 53),
        ("tcp", "127.0.0.1", on_loopback.port),
        ("udp", "127.0.0.1", on_loopback.port),
    ]
    names = ["kubernetes.default.svc.cluster.local", "kubernetes.default", "localhost"]
    probe = sandbox_pod(
        kube_cluster, sandbox_image, ("python3", "-c", PROBE, json.dumps(targets), json.dumps(names))
    )
    pod = probe["metadata"]["name"]
    try:
        kube_cluster.apply(probe)
        kube_cluster.wait_for_phase(pod, "Succeeded", START_TIMEOUT)
        verdict = json.loads(kube_cluster.logs(pod))
    finally:
        node_hits, loopback_hits = on_node.hits(), on_loopback.hits()
        on_node.stop()
        on_loopback.stop()
    outcomes = {(kind, host, port): outcome for kind, host, port, outcome in verdict["results"]}
    assert verdict["own_loopback"] == "ping", verdict
    # An eth0 (containerd requires one) with no route but its own range: no default route.
    assert verdict["interfaces"] == ["lo", "eth0"], verdict
    assert verdict["route_destinations"] == [other_ip.rsplit(".", 2)[0] + ".0.0"], verdict
    # Another pod, on-link: no neighbour ever answers (TCP), and the datagram arrives nowhere.
    assert outcomes[("tcp", other_ip, other_port)] in ("EHOSTUNREACH", "timeout"), verdict
    assert "hit" not in kube_cluster.logs(other_pod).split(), "another pod was reached"
    # The node, its API server, its kubelet, the Service range: no route at all.
    for target in targets[2:8]:
        assert outcomes[target] == "ENETUNREACH", (target, verdict)
    # The pod's 127.0.0.1 is its own: the host's loopback listener is not there.
    assert outcomes[("tcp", "127.0.0.1", on_loopback.port)] == "ECONNREFUSED", verdict
    assert (node_hits, loopback_hits) == (0, 0)
    # No DNS: the cluster's names do not resolve; localhost does, from the image's /etc/hosts.
    assert verdict["dns"]["kubernetes.default.svc.cluster.local"] == "gaierror", verdict
    assert verdict["dns"]["kubernetes.default"] == "gaierror", verdict
    assert "127.0.0.1" in verdict["dns"]["localhost"], verdict


def test_the_sandbox_namespace_refuses_a_pod_that_is_not_restricted(
    kube_cluster: Cluster, sandbox_image: str
) -> None:
    # The sandbox's own pods pass Pod Security "restricted" (the test above runs them); a pod
    # that asks for the host's network, as a bridge's own pod might, does not get in there.
    manifest = sandbox_pod(kube_cluster, sandbox_image, ("true",))
    manifest["spec"]["hostNetwork"] = True
    with pytest.raises(KubectlError, match='violates PodSecurity "restricted'):
        kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(manifest))


NODE_NETWORK_CLASS = "kernelbridge-node-network"
"""The RuntimeClass `kube-cluster.sh up` makes for the bridge's own pod: a route to the node only."""


@pytest.fixture
def bridge_namespace(kube_cluster: Cluster) -> Iterator[str]:
    """A namespace of this test for a pod like the bridge's own, Pod Security "restricted" too."""
    name = f"kbtest-{secrets.token_hex(4)}"
    kube_cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
        }
    )
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=true", timeout=180)


def test_the_node_network_reaches_the_api_server_and_no_sandbox_gets_it(
    kube_cluster: Cluster, sandbox_image: str, bridge_namespace: str
) -> None:
    # What the bridge's own pod will need (a later part of issue 21): the API server, from a pod
    # that is as restricted as a sandbox otherwise. Its network is a route to the node alone.
    api_host, api_port = api_server(kube_cluster)
    service_ip = kube_cluster.get("service", "kubernetes", namespace="default")["spec"]["clusterIP"]
    on_loopback = HostListener("127.0.0.1")
    targets = [("tcp", api_host, api_port), ("tcp", service_ip, 443), ("tcp", "127.0.0.1", on_loopback.port)]
    command = ("python3", "-c", PROBE, json.dumps(targets), json.dumps([]))
    manifest = sandbox_pod(kube_cluster, sandbox_image, command)
    manifest["metadata"]["namespace"] = bridge_namespace
    manifest["spec"]["runtimeClassName"] = NODE_NETWORK_CLASS
    pod = manifest["metadata"]["name"]
    try:
        kube_cluster.apply(manifest)
        kube_cluster.wait_for_phase(pod, "Succeeded", START_TIMEOUT, namespace=bridge_namespace)
        verdict = json.loads(kube_cluster.logs(pod, namespace=bridge_namespace))
    finally:
        loopback_hits = on_loopback.hits()
        on_loopback.stop()
    outcomes = [outcome for *_, outcome in verdict["results"]]
    # The API server answers; no kube-proxy, so no Service address; the host's loopback is not
    # the pod's.
    assert outcomes == ["connected", "ENETUNREACH", "ECONNREFUSED"], verdict
    assert loopback_hits == 0
    # The sandbox namespace refuses that RuntimeClass (an admission policy of `up`).
    sandbox = sandbox_pod(kube_cluster, sandbox_image, ("true",))
    sandbox["spec"]["runtimeClassName"] = NODE_NETWORK_CLASS
    with pytest.raises(KubectlError, match="get no network"):
        kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(sandbox))
