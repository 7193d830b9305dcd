"""A sandbox as a Kubernetes Pod: the manifest, rendered from the sandbox flags
(:mod:`kernelbridge.runtime.flags`), and the deny-all NetworkPolicy that goes with it. No I/O, no client.

A durable sandbox's pod has a second container, ``handover`` (uid :data:`RELAY_UID`, no volume of the
sandbox's), that a later bridge reaches with ``pods/exec``. The field mapping and what has no Pod
field: ``docs/kubernetes.md`` ("The Pod spec"), docs/design/runtime.md.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kernelbridge.inside.handover import DEFAULT_SOCKET
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.flags import sandbox_flags, size_bytes

SANDBOX_LABEL = "kernelbridge.sandbox"
"""Set to ``true`` on every sandbox pod: what the NetworkPolicy selects."""
CONTAINER_NAME = "sandbox"
TERMINATION_GRACE = 2
"""Seconds between SIGTERM and SIGKILL when a pod is deleted: the agent exits on EOF, not on a
signal, and a sandbox holds nothing worth a long grace."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""docker and podman run a container whose image sets no PATH with this one; a Pod (containerd,
``podman kube play``) gets none, and the sandbox image, imported from a root file system, sets none."""
HANDOVER_CONTAINER = "handover"
RELAY_UID = 65533
"""The handover container's uid: not the kernel's (65534), not root (``runAsNonRoot``)."""
HANDOVER_MEMORY = 32 * 1024**2
"""What an idle ``sleep`` and one handover (python3, the standard library) take, with room."""
RELAY_UID_ENV = "KERNELBRIDGE_RELAY_UID"
AGENT_PID_ENV = "KERNELBRIDGE_AGENT_PID"
"""The agent's pid as the handover sees it: 0, as ``SO_PEERCRED`` reports a peer of another
pid namespace (the sandbox container's). The only listener of the agent's name in the pod's
network namespace is the agent: it binds it before any kernel code runs and holds it for its
life, and when it exits every process of its container goes with it."""
_NAME = re.compile(r"[^a-z0-9-]+")
_VOLUME_SUFFIX = {"/tmp": "tmp", "/workspace": "ws", "/packages": "pkg"}
"""Volume names of the usual mounts (another mount is named after its path)."""
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


def _volume_name(pod: str, path: str) -> str:
    suffix = _VOLUME_SUFFIX.get(path) or _NAME.sub("-", path.strip("/").lower()).strip("-")
    return f"{pod[:55]}-{suffix}"


def pod_manifest(
    spec: ContainerSpec, *, runtime_class: str | None = None, namespace: str | None = None
) -> dict[str, Any]:
    """The Pod of one sandbox. ``runtime_class`` names a RuntimeClass (e.g. ``gvisor``, ``kata``)
    for a second wall around the kernel; None uses the cluster's default runtime."""
    flags = sandbox_flags(spec)
    uid, gid = flags.uid_gid
    name = pod_name(flags.name)
    cpu = f"{int(flags.cpus * 1000)}m"
    env = dict(flags.env)
    env.setdefault("PATH", DEFAULT_PATH)
    if spec.durable:
        env[RELAY_UID_ENV] = str(RELAY_UID)
    labels = {SANDBOX_LABEL: "true", "app.kubernetes.io/managed-by": "kernelbridge"}
    labels.update({key: label_value(value) for key, value in flags.labels.items()})
    # Volume names are per pod in Kubernetes, but `podman kube play` turns an emptyDir into a
    # named volume of the whole engine: unique names keep two sandboxes' files apart there too.
    mounts = [m for m in flags.tmpfs if not m.covers_engine_default]
    volumes = {m.path: _volume_name(name, m.path) for m in mounts}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": flags.image,
        # Never pull: the image is built (or loaded) on the node, and a miss must fail fast.
        "imagePullPolicy": "Always" if flags.pull else "Never",
        "workingDir": flags.workdir,
        # stdio is the tunnel: attached once (pods/attach), closed for good when the host closes it
        # (a durable sandbox's later bridges come in through pods/exec, see docs/kubernetes.md).
        "stdin": True,
        "stdinOnce": flags.stdin_once,
        "tty": False,
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "allowPrivilegeEscalation": not flags.no_new_privileges,
            "privileged": False,
            "readOnlyRootFilesystem": flags.read_only,
            "capabilities": {"drop": list(flags.cap_drop)},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": {
            # requests = limits: the scheduler reserves what the sandbox may use (Guaranteed QoS,
            # the last class evicted under node pressure).
            "limits": {"memory": quantity(flags.memory), "cpu": cpu},
            "requests": {"memory": quantity(flags.memory), "cpu": cpu},
        },
        "volumeMounts": [{"name": volumes[m.path], "mountPath": m.path} for m in mounts]
        + [
            {"name": _volume_name(name, b.target), "mountPath": b.target, "readOnly": True}
            for b in flags.binds
        ],
    }
    if flags.command:
        container["command"] = list(flags.command)
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
            "runAsUser": uid,
            "runAsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        # Memory-backed and sized: like the container's tmpfs mounts, counted against the pod's memory.
        "volumes": [
            {"name": volumes[m.path], "emptyDir": {"medium": "Memory", "sizeLimit": quantity(m.size)}}
            for m in mounts
        ]
        + [
            {"name": _volume_name(name, b.target), "hostPath": {"path": b.source, "type": "Directory"}}
            for b in flags.binds
        ],
    }
    if spec.durable:
        pod_spec["containers"].append(_handover_container(flags.image))
        memory = quantity(str(flags.memory_bytes + HANDOVER_MEMORY))
        pod_spec["resources"] = {
            "limits": {"memory": memory, "cpu": cpu},
            "requests": {"memory": memory, "cpu": cpu},
        }
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    metadata: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "annotations": flags.labels,
    }
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


_WATCH_AGENT = (
    # Idle while the agent lives, then end, so that the pod ends with its sandbox (restartPolicy
    # Never): the agent's abstract socket is listed in the pod's network namespace from before
    # its kernel starts until it exits. No shell of the sandbox's: this container's own, fixed.
    f"n=0; until grep -q '@{DEFAULT_SOCKET}$' /proc/net/unix; do n=$((n+1)); [ $n -gt 1200 ] && exit 1;"
    f" sleep 0.5; done; while grep -q '@{DEFAULT_SOCKET}$' /proc/net/unix; do sleep 2; done"
)


def _handover_container(image: str) -> dict[str, Any]:
    """The durable sandbox's second container (module docstring): idle, ``pods/exec`` target."""
    return {
        "name": HANDOVER_CONTAINER,
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", _WATCH_AGENT],
        "workingDir": "/",
        "env": [{"name": "PATH", "value": DEFAULT_PATH}, {"name": AGENT_PID_ENV, "value": "0"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RELAY_UID,
            "runAsGroup": RELAY_UID,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


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
