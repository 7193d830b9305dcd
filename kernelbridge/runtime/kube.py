"""A sandbox as a Kubernetes Pod: the manifest, generated from the same settings as the container
flags (``engine_spec``), and the deny-all NetworkPolicy that goes with it. No I/O, no client.

This is the first piece of the Kubernetes runtime designed in ``docs/kubernetes.md``; the backend
itself (pods/attach for stdio) is not written yet. ``podman kube play`` runs these manifests, which
is how the tests prove them.

What maps one to one: user 65534, no privilege escalation, all capabilities dropped, read-only
root, memory (requests = limits) and cpu limits, memory-backed and sized /tmp and /workspace,
workdir, stdin open once, no network (the NetworkPolicy), no registry pulls (``imagePullPolicy:
Never``). What has no Pod field: the pids limit (the kubelet's ``podPidsLimit``) and the nofile/
nproc ulimits (the container runtime's defaults): node settings, listed in the doc.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kernelbridge.runtime.base import WORKDIR, ContainerSpec
from kernelbridge.runtime.engine_spec import size_bytes

SANDBOX_LABEL = "kernelbridge.sandbox"
"""Set to ``true`` on every sandbox pod: what the NetworkPolicy selects."""
CONTAINER_NAME = "sandbox"
TERMINATION_GRACE = 2
"""Seconds between SIGTERM and SIGKILL when a pod is deleted: the agent exits on EOF, not on a
signal, and a sandbox holds nothing worth a long grace."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""docker and podman run a container whose image sets no PATH with this one; a Pod (containerd,
``podman kube play``) gets none, and the sandbox image, imported from a root file system, sets none."""
_NAME = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def quantity(size: str) -> str:
    """``512m`` (binary units, as docker reads it) -> ``512Mi``; a byte count otherwise."""
    value = size_bytes(size)
    for unit, factor in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def pod_name(name: str) -> str:
    """A DNS-1123 label: lowercase alphanumerics and '-', at most 63, alphanumeric at both ends."""
    cleaned = _NAME.sub("-", name.lower()).strip("-")[:63].strip("-")
    return cleaned or "kernelbridge-sandbox"


def label_value(value: str) -> str:
    """A label value (at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends); the exact
    value goes into an annotation."""
    return _LABEL_VALUE.sub("_", value)[:63].strip("._-")


def pod_manifest(
    spec: ContainerSpec, *, runtime_class: str | None = None, namespace: str | None = None
) -> dict[str, Any]:
    """The Pod of one sandbox. ``runtime_class`` names a RuntimeClass (e.g. ``gvisor``, ``kata``)
    for a second wall around the kernel; None uses the cluster's default runtime."""
    lim = spec.limits
    uid, _, gid = lim.user.partition(":")
    name = pod_name(spec.name)
    # Volume names are per pod in Kubernetes, but `podman kube play` turns an emptyDir into a
    # named volume of the whole engine: unique names keep two sandboxes' files apart there too.
    tmp, workspace = f"{name[:55]}-tmp", f"{name[:55]}-ws"
    env = dict(spec.env)
    env.setdefault("PATH", DEFAULT_PATH)
    labels = {SANDBOX_LABEL: "true", "app.kubernetes.io/managed-by": "kernelbridge"}
    labels.update({key: label_value(value) for key, value in spec.all_labels().items()})
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        # Never pull: the image is built (or loaded) on the node, and a miss must fail fast.
        "imagePullPolicy": "Never",
        "workingDir": WORKDIR,
        # stdio is the tunnel: attached once (pods/attach), closed for good when the host closes it.
        "stdin": True,
        "stdinOnce": True,
        "tty": False,
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": int(uid),
            "runAsGroup": int(gid or uid),
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": lim.read_only,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": {
            # requests = limits: the scheduler reserves what the sandbox may use (Guaranteed QoS,
            # the last class evicted under node pressure).
            "limits": {"memory": quantity(lim.memory), "cpu": f"{int(lim.cpus * 1000)}m"},
            "requests": {"memory": quantity(lim.memory), "cpu": f"{int(lim.cpus * 1000)}m"},
        },
        "volumeMounts": [
            {"name": tmp, "mountPath": "/tmp"},
            {"name": workspace, "mountPath": WORKDIR},
        ],
    }
    if spec.command:
        container["command"] = list(spec.command)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # No API credentials, no service discovery variables: nothing of the cluster inside.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": int(uid),
            "runAsGroup": int(gid or uid),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            # Memory-backed and sized: like the tmpfs mounts of the container flags, counted
            # against the pod's memory.
            {"name": tmp, "emptyDir": {"medium": "Memory", "sizeLimit": quantity(lim.tmp_size)}},
            {"name": workspace, "emptyDir": {"medium": "Memory", "sizeLimit": quantity(lim.workspace_size)}},
        ],
    }
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    metadata: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "annotations": spec.all_labels(),
    }
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def network_policy(namespace: str | None = None) -> dict[str, Any]:
    """Deny every ingress and egress of sandbox pods (``--network none``'s equivalent: the pod
    keeps its loopback, which the kernel's own sockets use)."""
    metadata: dict[str, Any] = {"name": "kernelbridge-sandboxes-deny-all"}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX_LABEL: "true"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def to_yaml(*documents: dict[str, Any]) -> str:
    """Documents as YAML for ``kubectl apply -f`` / ``podman kube play``: JSON is YAML, so no YAML
    library is needed, one document per ``---``."""
    return "---\n".join(json.dumps(doc, indent=2) + "\n" for doc in documents)
