"""What a Pod object says of its sandbox, as the seam's records (no I/O): the sandbox container's
state, exit code and OOM kill, why the cluster ended the pod (evicted, deleted), why it waits."""

from __future__ import annotations

from typing import Any

from kernelbridge.runtime.base import ContainerInfo, ContainerState
from kernelbridge.runtime.kube.manifest import CONTAINER_NAME


def sandbox_status(pod: dict[str, Any]) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            return dict(status)
    return {}


def pending_reason(pod: dict[str, Any]) -> str:
    """Why a pod waits, in one line (the scheduler's word, or the container's)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return " ".join(str(condition.get("message") or condition.get("reason") or "").split())[:300]
    waiting = (sandbox_status(pod).get("state") or {}).get("waiting") or {}
    return str(waiting.get("reason") or (pod.get("status") or {}).get("phase") or "pending")


def container_info(pod: dict[str, Any]) -> ContainerInfo:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    state = sandbox_status(pod).get("state") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    labels.update({str(k): str(v) for k, v in (meta.get("annotations") or {}).items()})
    exit_code: int | None = None
    oom = False
    if meta.get("deletionTimestamp"):
        current = ContainerState.REMOVING
    elif "running" in state:
        current = ContainerState.RUNNING
    elif "terminated" in state or status.get("phase") in ("Succeeded", "Failed"):
        current = ContainerState.EXITED
        terminated = state.get("terminated") or {}
        if terminated.get("exitCode") is not None:
            exit_code = int(terminated["exitCode"])
        oom = terminated.get("reason") == "OOMKilled"
    else:
        current = ContainerState.CREATED
    return ContainerInfo(
        id=str(meta.get("name", "")),
        name=str(meta.get("name", "")),
        labels=labels,
        state=current,
        exit_code=exit_code,
        oom_killed=oom,
        reason=ended_by_cluster(pod),
    )


def ended_by_cluster(pod: dict[str, Any]) -> str:
    """Why the cluster ended the pod (evicted, deleted), in one line; empty if it did not."""
    status = pod.get("status") or {}
    if status.get("reason") == "Evicted":
        return f"the pod was evicted: {' '.join(str(status.get('message') or '').split())[:300]}"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            said = " ".join(str(condition.get("message") or "").split())[:300]
            return f"the cluster ended the pod ({condition.get('reason')}: {said})"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "the pod is being deleted"
    return ""
