"""A cluster of two nodes, one of which dies: the sessions on the other keep their variables, a
session on the dead node is told so in one line, with the ``restore=`` that rebuilds it, and its
next calls get a fresh sandbox on the node that lives (``scripts/kube-second-node.sh`` adds the
node; every other setting at its default: a real bridge over stdio, its warm pool of one).

The second node has 1 cpu to offer (the first 2) and a sandbox asks for 1, so the three sessions
fill both nodes; the lost session's fresh sandbox needs the room a closed session leaves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import Bridge, Result, open_bridge
from kube_harness import REPO, SANDBOX_NAMESPACE, Cluster

from kernelbridge.host.container import STATE_LABEL, state_identity

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.slow, pytest.mark.timeout(900)]

SECOND_NODE = REPO / "scripts" / "kube-second-node.sh"
FIRST, SECOND = "kernelbridge-node", "kernelbridge-node-2"
NODE_TIMEOUT = 300.0
"""`up` imports the sandbox image (~1 GB) into the new node's containerd."""
RECOVERY = 300.0
"""How long the lost session may take to get a fresh sandbox: the scheduler places pods on the
dead node until the node controller marks it NotReady (its grace period is 50 s)."""


async def second_node(*args: str) -> None:
    with anyio.fail_after(NODE_TIMEOUT):
        result = await anyio.run_process([str(SECOND_NODE), *args], check=False)
    assert result.returncode == 0, f"kube-second-node.sh {args[0]}: {result.stderr.decode()[-2000:]}"


@pytest.fixture
def state(tmp_path: Path, kube_cluster: Cluster) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    selector = f"{STATE_LABEL}={state_identity(state_dir)}"
    kube_cluster.kubectl(
        "-n", SANDBOX_NAMESPACE, "delete", "pods", "-l", selector, "--grace-period=1", "--wait=true",
        timeout=180,
    )  # fmt: skip


def node_of(cluster: Cluster, pod: str) -> str:
    return str(cluster.get("pod", pod)["spec"]["nodeName"])


def said_in_one_line(result: Result) -> None:
    """An error the agent can read: the bridge's own sentence, not the SDK's wrapper of a crash."""
    assert "Error executing tool" not in result.text, result.text
    if result.status is None:  # refused: a tool error of one line
        assert result.is_error and len(result.text.strip().splitlines()) == 1, result.text
    else:  # ran on a fresh sandbox: the notes say what was lost
        assert result.codes, result.text


async def sessions_on_both_nodes(bridge: Bridge, cluster: Cluster) -> dict[str, str]:
    """Sessions s0, s1, ... (s<i> holds ``v = i``) until both nodes run one: session -> node."""
    nodes: dict[str, str] = {}
    for i in range(3):
        made = await bridge.run(f"v = {i}", f"s{i}", timeout=60)
        assert made.status == "ok", made.text
        nodes[f"s{i}"] = node_of(cluster, await bridge.container(f"s{i}"))
        if set(nodes.values()) == {FIRST, SECOND}:
            return nodes
    raise AssertionError(f"the scheduler never used the second node: {nodes}")


async def test_a_dead_node_takes_only_its_own_sessions(
    state: Path, kube_cluster: Cluster, sandbox_image: str
) -> None:
    kube = {"KERNELBRIDGE_RUNTIME": "kube", "KUBECONFIG": str(kube_cluster.kubeconfig)}
    await second_node("up", sandbox_image)
    try:
        async with open_bridge(state, **kube) as bridge:
            nodes = await sessions_on_both_nodes(bridge, kube_cluster)
            await second_node("stop")  # every process of the node killed, no word

            lost = [s for s, node in nodes.items() if node == SECOND]
            kept = [s for s, node in nodes.items() if node == FIRST]
            for session in kept:
                again = await bridge.run("print(v)", session)
                assert again.status == "ok" and again.stdout == f"{session[1:]}\n", again.text
            answers = []
            for session in lost:
                gone = await bridge.run("print(v)", session)
                assert gone.status != "ok", gone.text
                said_in_one_line(gone)
                answers.append(gone)

            # Room on the first node for the lost session's fresh sandbox.
            await bridge.close(kept[0])
            deadline = time.monotonic() + RECOVERY
            while True:
                fresh = await bridge.run("print('v' in globals())", lost[0], timeout=60)
                answers.append(fresh)
                if fresh.status == "ok":
                    break
                said_in_one_line(fresh)
                assert time.monotonic() < deadline, f"no fresh sandbox in {RECOVERY:g} s: {fresh.text}"
            assert fresh.stdout == "False\n", fresh.text
            assert node_of(kube_cluster, await bridge.container(lost[0])) == FIRST

            # The loss was said with the restore= that brings its variables back.
            offers = [answer.notes for answer in answers if "restore=" in answer.notes]
            assert offers, [answer.text for answer in answers]
            restore = offers[0].split("restore='", 1)[1].split("'", 1)[0]
            await bridge.close(lost[0])
            restored = await bridge.run("print(v)", lost[0], restore=restore, timeout=120)
            assert restored.status == "ok" and restored.stdout == f"{lost[0][1:]}\n", restored.text
    finally:
        await second_node("down")
    assert SECOND not in kube_cluster.kubectl("get", "nodes", "-o", "name"), "down removed the Node"
