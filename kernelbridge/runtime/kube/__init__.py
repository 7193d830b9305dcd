"""Kubernetes: a sandbox as a Pod. The design of the backend is ``docs/kubernetes.md``; what
exists is the manifest (``manifest``: the Pod and the deny-all NetworkPolicy, rendered from
``runtime.flags``), proven under ``podman kube play`` by ``tests/runtime/test_kube.py``."""

from kernelbridge.runtime.kube.manifest import (
    CONTAINER_NAME,
    SANDBOX_LABEL,
    label_value,
    network_policy,
    pod_manifest,
    pod_name,
    quantity,
    to_yaml,
)

__all__ = [
    "CONTAINER_NAME",
    "SANDBOX_LABEL",
    "label_value",
    "network_policy",
    "pod_manifest",
    "pod_name",
    "quantity",
    "to_yaml",
]
