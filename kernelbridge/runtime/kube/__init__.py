"""Kubernetes: a sandbox as a Pod (``KERNELBRIDGE_RUNTIME=kube``).

Design: ``docs/kubernetes.md``; notes moved out of these modules: ``docs/design/runtime.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    import kernelbridge.config
    from kernelbridge.runtime.kube.api import KubeRuntime
    from kernelbridge.runtime.kube.manifest import (
        CONTAINER_NAME,
        HANDOVER_CONTAINER,
        RELAY_UID,
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
    "HANDOVER_CONTAINER",
    "RELAY_UID",
    "SANDBOX_LABEL",
    "KubeRuntime",
    "label_value",
    "network_policy",
    "open_kube",
    "pod_manifest",
    "pod_name",
    "quantity",
    "to_yaml",
]


async def open_kube(settings: kernelbridge.config.Settings) -> KubeRuntime:
    """The cluster of ``settings`` (not yet entered), once its API server answered and the
    sandbox namespace exists. Raises RuntimeUnavailable with one line (no configuration, an
    unreachable server, credentials refused, no such namespace)."""
    import anyio

    from kernelbridge.errors import RuntimeUnavailable
    from kernelbridge.runtime.cli.backend import CliRuntime
    from kernelbridge.runtime.kube.api import KubeRuntime
    from kernelbridge.runtime.kube.connect import connect, load_config
    from kernelbridge.runtime.kube.errors import ClusterRefused
    from kernelbridge.runtime.kube.images import KubeImages

    kube = settings.kube
    config, source = load_config(kube.kubeconfig)
    conn = connect(config, source, kube.namespace)
    runtime = KubeRuntime(conn, namespace=kube.namespace, runtime_class=kube.runtime_class)
    try:
        version = await runtime.api.json("GET", "/version", what="for its version")
        runtime.version = str((version or {}).get("gitVersion") or "")
        await runtime.api.json(
            "GET", f"/api/v1/namespaces/{kube.namespace}/pods", query={"limit": "1"}, what="to list pods"
        )
        # Listing a namespace that does not exist answers an empty list; a (dry-run) create says
        # 404, and proves the right to create the Leases of durable pods.
        probe = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "kernelbridge-probe"},
            "spec": {"holderIdentity": "probe", "leaseDurationSeconds": 1},
        }
        try:
            await runtime.api.json(
                "POST", runtime.leases.path(), probe, query={"dryRun": "All"}, what="to create a Lease"
            )
        except ClusterRefused as exc:
            if exc.status == 404:
                raise RuntimeUnavailable(
                    f"the namespace {kube.namespace!r} does not exist on {conn.where} "
                    "(KERNELBRIDGE_KUBE_NAMESPACE; create it with pod security restricted)"
                ) from None
            if exc.status != 409:  # one of that name exists: the namespace does too
                raise
    except BaseException:
        with anyio.CancelScope(shield=True):
            await conn.aclose()
        raise
    import shutil

    local = None
    podman = shutil.which("podman")
    if podman and kube.image_loader:
        local = CliRuntime("podman", podman, workdir=settings.run_dir).images
    runtime.images = KubeImages(runtime.api, kube.namespace, local, kube.image_loader)
    return runtime


if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
