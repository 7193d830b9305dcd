"""Sessions that outlive their bridge, on Kubernetes: real bridges (``KERNELBRIDGE_RUNTIME=kube``
on the development cluster, every other setting at its default), real MCP clients over stdio,
sandboxes as pods (tests/integration/test_durable_sessions.py is the same on podman).

A representative subset: a client restart keeps variables, a SIGKILL mid-cell, a forged adoption,
the idle self-end; and what only a cluster has: a Lease held by a bridge that died elsewhere, a
pod evicted mid-cell. The pods a test leaves are deleted by the state directory's label.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge, stop_process_tree
from durable_harness import forge_secret
from kube_harness import SANDBOX_NAMESPACE, Cluster, KubectlError
from waiting import hang_guard

from kernelbridge.host.container import STATE_LABEL, state_identity
from kernelbridge.runtime.kube.lease import micro_time

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.slow]

WAIT = 120.0


@pytest.fixture
def kube(kube_cluster: Cluster) -> dict[str, str]:
    """The runtime these bridges use (the setting this module is about) and its cluster."""
    return {"KERNELBRIDGE_RUNTIME": "kube", "KUBECONFIG": str(kube_cluster.kubeconfig)}


@pytest.fixture
def state(tmp_path: Path, kube_cluster: Cluster) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    selector = f"{STATE_LABEL}={state_identity(state_dir)}"
    kube_cluster.kubectl(
        "-n", SANDBOX_NAMESPACE, "delete", "pods", "-l", selector, "--grace-period=1", "--wait=true"
    )


def pods_of(cluster: Cluster, state_dir: Path) -> dict[str, dict[str, object]]:
    """The pods labelled with ``state_dir``'s identity: name -> the sandbox container's state."""
    selector = f"{STATE_LABEL}={state_identity(state_dir)}"
    found = json.loads(cluster.kubectl("-n", SANDBOX_NAMESPACE, "get", "pods", "-l", selector, "-o", "json"))
    pods = {}
    for pod in found["items"]:
        statuses = {s["name"]: s.get("state", {}) for s in pod.get("status", {}).get("containerStatuses", [])}
        pods[pod["metadata"]["name"]] = statuses.get("sandbox", {})
    return pods


def running(cluster: Cluster, state_dir: Path) -> list[str]:
    return [name for name, state in pods_of(cluster, state_dir).items() if "running" in state]


async def wait_for(condition: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await anyio.sleep(0.5)


def lease_of(cluster: Cluster, pod: str) -> dict[str, object]:
    return cluster.get("lease", pod)["spec"]  # type: ignore[no-any-return]


async def test_a_client_restart_keeps_variables_and_the_pod(
    state: Path, kube: dict[str, str], kube_cluster: Cluster
) -> None:
    async with open_bridge(state, **kube) as bridge:
        made = await bridge.run("import fractions\nx = fractions.Fraction(3, 7)\nprint('made')", "s")
        assert made.status == "ok", made.text
        pod = await bridge.container("s")
        assert lease_of(kube_cluster, pod).get("holderIdentity", "").endswith(f"/{bridge.pid}")
    # The client exited: its bridge let go of the pod (and of its Lease), which runs on.
    assert pod in running(kube_cluster, state)
    assert not lease_of(kube_cluster, pod).get("holderIdentity"), "the Lease was released"
    async with open_bridge(state, **kube) as bridge:
        again = await bridge.run("print(x, fractions.__name__)", "s")
        assert again.status == "ok" and again.stdout == "3/7 fractions\n", again.text
        assert again.data["state"] == "kept" and "adopted" in again.codes, again.text
        assert await bridge.container("s") == pod
        assert lease_of(kube_cluster, pod).get("holderIdentity", "").endswith(f"/{bridge.pid}")
        await bridge.close("s")
    await wait_for(lambda: pod not in pods_of(kube_cluster, state), "close_session deleted the pod")


async def test_sigkill_mid_cell_then_a_new_bridge_hears_how_the_cell_ended(
    state: Path, kube: dict[str, str], kube_cluster: Cluster
) -> None:
    async with open_bridge(state, **kube) as bridge:
        assert (await bridge.run("import time\ny = 41", "s")).status == "ok"
        pod = await bridge.container("s")

        def began() -> bool:
            out = kube_cluster.kubectl(
                "-n", SANDBOX_NAMESPACE, "exec", pod, "-c", "sandbox", "--", "ls", "/workspace"
            )
            return "started" in out.split()

        async def long_cell() -> None:
            with pytest.raises(Exception):  # noqa: B017 - the bridge is killed under it
                await bridge.run(
                    "open('/workspace/started', 'w').close()\ntime.sleep(8)\ny += 1\nprint('late', y)", "s"
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_cell)
            await wait_for(began, "the cell began")
            stop_process_tree(bridge.pid)  # SIGKILL, mid-cell: its Lease stays, held by a dead pid
    assert pod in running(kube_cluster, state), "the pod died with its bridge"
    async with open_bridge(state, **kube) as bridge:
        result = await bridge.run("print('now', y)", "s")
        assert result.status == "ok" and "adopted" in result.codes, result.text
        assert result.stdout == "now 42\n" and "late 42" in result.notes, result.text
        await bridge.close("s")


async def test_a_forged_adoption_is_refused_and_the_session_goes_on_fresh(
    state: Path, kube: dict[str, str]
) -> None:
    async with open_bridge(state, **kube) as bridge:
        assert (await bridge.run("secret_value = 1", "s")).status == "ok"
    forge_secret(state, "s")  # a well-formed secret, not the sandbox's
    async with open_bridge(state, **kube) as bridge:
        refused = await bridge.run("print('hello')", "s")
        assert "sandbox_lost" in refused.codes and "secret" in refused.notes, refused.text
        fresh = await bridge.run("print('secret_value' in globals())", "s")
        assert fresh.status == "ok" and fresh.stdout == "False\n", fresh.text
        await bridge.close("s")


async def test_a_detached_pod_ends_itself_after_its_idle_timeout(
    state: Path, kube: dict[str, str], kube_cluster: Cluster
) -> None:
    async with open_bridge(state, **kube, KERNELBRIDGE_IDLE_TIMEOUT="3") as bridge:
        assert (await bridge.run("v = 1", "s")).status == "ok"
        pod = await bridge.container("s")
    # The agent ends itself; the handover container sees it go and ends too: the pod is done.
    await wait_for(lambda: pod not in running(kube_cluster, state), "it ended itself with no bridge")
    await wait_for(
        lambda: kube_cluster.get("pod", pod)["status"]["phase"] in ("Succeeded", "Failed"),
        "the whole pod ended",
    )
    async with open_bridge(state, **kube) as bridge:
        result = await bridge.run("print('v' in globals())", "s")
        assert "sandbox_lost" in result.codes and "idle timeout" in result.notes, result.text
        await bridge.close("s")


async def test_a_lease_held_by_a_bridge_that_died_elsewhere_is_taken_over(
    state: Path, kube: dict[str, str], kube_cluster: Cluster
) -> None:
    async with open_bridge(state, **kube) as bridge:
        assert (await bridge.run("w = 'kept'", "s")).status == "ok"
        pod = await bridge.container("s")
    # What a bridge on another machine that died while attached leaves: a Lease it renewed just now.
    patch = {"spec": {"holderIdentity": "another-machine/4242", "renewTime": micro_time(time.time())}}
    kube_cluster.kubectl(
        "-n", SANDBOX_NAMESPACE, "patch", "lease", pod, "--type", "merge", "-p", json.dumps(patch)
    )
    async with open_bridge(state, **kube) as bridge:
        with hang_guard(40, "a takeover of the Lease: its expiry, no longer"):
            result = await bridge.run("print(w)", "s")
        assert result.status == "ok" and result.stdout == "kept\n" and "adopted" in result.codes, result.text
        assert lease_of(kube_cluster, pod).get("holderIdentity", "").endswith(f"/{bridge.pid}")
        await bridge.close("s")


async def test_a_pod_evicted_mid_cell_is_said_and_the_next_call_gets_a_fresh_one(
    state: Path, kube: dict[str, str], kube_cluster: Cluster
) -> None:
    async with open_bridge(state, **kube) as bridge:
        assert (await bridge.run("import time\nu = 1", "s")).status == "ok"
        pod = await bridge.container("s")
        evicted: list[str] = []

        async def evict() -> None:
            await anyio.sleep(3)  # the cell is running
            eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}
            kube_cluster.kubectl(
                "create", "--raw", f"/api/v1/namespaces/{SANDBOX_NAMESPACE}/pods/{pod}/eviction",
                "-f", "-", stdin=json.dumps(eviction),
            )  # fmt: skip
            evicted.append(pod)

        async with anyio.create_task_group() as tg:
            tg.start_soon(evict)
            died = await bridge.run("time.sleep(30)", "s", timeout=60)
        assert evicted and died.status == "kernel_died" and died.data["state"] == "lost", died.text
        assert "the cluster ended the pod" in died.text or "being deleted" in died.text, died.text
        assert "\n" not in died.data["notes"][0], died.data["notes"]
        fresh = await bridge.run("print('u' in globals())", "s")
        assert fresh.status == "ok" and fresh.stdout == "False\n", fresh.text
        assert await bridge.container("s") != pod
        await bridge.close("s")
    with pytest.raises(KubectlError):
        kube_cluster.get("pod", pod)


async def test_kernel_code_cannot_reach_the_handover(state: Path, kube: dict[str, str]) -> None:
    """The handover runs in a container of its own (uid 65533, its own pid and mount namespaces):
    kernel code sees none of its processes, cannot take the agent's socket name, and is hung up
    on when it offers the agent pipes of its own; its own bridge is unaffected."""
    probe = """
import array, os, socket
verdict = {"uids": sorted({os.stat(f"/proc/{p}").st_uid for p in os.listdir("/proc") if p.isdigit()})}
try:
    s = socket.socket(socket.AF_UNIX); s.bind("\\0kernelbridge-agent"); verdict["bound"] = True
except OSError as exc:
    verdict["bound"] = exc.errno
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect("\\0kernelbridge-agent")
r, w = os.pipe()
try:
    s.sendmsg([b"H"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, w]))])
    verdict["answer"] = s.recv(1).decode()
except OSError as exc:
    verdict["answer"] = type(exc).__name__
"""
    async with open_bridge(state, **kube) as bridge:
        assert (await bridge.run("k = 1", "s")).status == "ok"
    async with open_bridge(state, **kube) as bridge:  # adopted: a handover ran and still runs
        found = await bridge.probe(probe, "s")
        assert found["uids"] == [65534], found  # no process of the handover's uid is visible
        assert found["bound"] == 98, found  # EADDRINUSE: the agent holds the name
        assert found["answer"] in ("", "ConnectionResetError", "BrokenPipeError"), found
        result = await bridge.run("print(k)", "s")
        assert result.stdout == "1\n", result.text
        await bridge.close("s")
