"""Issue 21's measurements: the project's own single-node cluster (``scripts/kube-cluster.sh``).

    .venv/bin/python bench/bench_kube.py [--rounds 5]

- **up / down**: when the cluster is not running, ``up`` (binaries built, the sandbox image
  already imported: a restart) and, at the end, ``down``; a running cluster is used as it is;
- **a sandbox pod's start**: a pod from ``pod_manifest`` (the sandbox's securityContext and
  limits, ``python3 -c pass``) from ``kubectl apply`` until the API reports the container
  running, and until it has exited (``Succeeded``), beside ``podman run --rm`` of the same image
  and command with ``--network none`` (the local engine's sandbox start), median of ``--rounds``.

- **the kube backend beside the podman engine API** (real bridges, ``kernelbridge serve`` over
  stdio, every setting at its default but ``KERNELBRIDGE_RUNTIME``), in one run: a cold sandbox
  (``create`` to the first echoed byte through the backend), the first call of a new session
  from the warm pool right after the pool filled (target <= 50 ms), a warm ``1+1`` (pods/attach
  vs the engine API: target <= 1.2x), and the first call on a bridge restarted after its client
  exited (the session adopted: pods/exec of the handover, the challenge) against the warm call
  (target <= 2x).

Needs the built binaries (``scripts/kube-cluster.sh build``), root and the sandbox image. Prints
one line per figure; fails on nothing. Every pod it makes is deleted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("KERNELBRIDGE_LABELS", "kernelbridge.bench=kube")

import anyio
from bridge_harness import open_bridge
from kube_harness import SANDBOX_NAMESPACE, SCRIPT, Cluster, script

from kernelbridge.config import SandboxLimits, load_settings
from kernelbridge.runtime import open_runtime
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.kube.manifest import pod_manifest
from kernelbridge.testing import ensure_sandbox_image

POLL = 0.05


def timed_pod(cluster: Cluster, image: str, index: int) -> tuple[float, float]:
    """Seconds from apply to the container running, and to the pod Succeeded."""
    spec = ContainerSpec(
        image=image,
        name=f"kbbench-{os.getpid()}-{index}",
        session="bench-kube",
        owner_pid=os.getpid(),
        limits=SandboxLimits(),
        command=("python3", "-c", "pass"),
    )
    manifest = pod_manifest(spec, namespace=SANDBOX_NAMESPACE)
    name = manifest["metadata"]["name"]
    started = time.monotonic()
    cluster.apply(manifest)
    running = None
    try:
        while time.monotonic() - started < 120:
            status = cluster.get("pod", name).get("status", {})
            state = (status.get("containerStatuses") or [{}])[0].get("state", {})
            if running is None and ("running" in state or "terminated" in state):
                running = time.monotonic() - started
            if status.get("phase") in ("Succeeded", "Failed"):
                return running or 0.0, time.monotonic() - started
            time.sleep(POLL)
        raise SystemExit(f"pod {name} did not finish")
    finally:
        cluster.kubectl("-n", SANDBOX_NAMESPACE, "delete", "pod", name, "--grace-period=1", "--wait=false")


PODMAN_RUN = "podman run --rm --network none --pull never --ulimit nofile=1024:1024 --ulimit nproc=4096:4096"
"""The sandbox's ulimits (runtime/flags.py): podman's own defaults need CAP_SYS_RESOURCE, which
root lacks on some machines (this one)."""


def podman_run(image: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [*PODMAN_RUN.split(), image, "python3", "-c", "pass"], check=True, capture_output=True, timeout=120
    )
    return time.monotonic() - started


async def cold_start(env: dict[str, str], image: str, rounds: int) -> float:
    """Median seconds from ``create`` to the first byte echoed by ``cat`` through the backend."""
    times = []
    async with open_runtime(load_settings({**os.environ, **env})) as runtime:
        for i in range(rounds):
            spec = ContainerSpec(
                image=image,
                name=f"kbbench-cold-{os.getpid()}-{i}",
                session="bench-cold",
                owner_pid=os.getpid(),
                command=("cat",),
                labels=(("kernelbridge.bench", "kube"),),
            )
            started = time.monotonic()
            container = await runtime.create(spec)
            try:
                stream = await runtime.attach(container)
                await stream.send(b"x")
                await stream.receive()
                times.append(time.monotonic() - started)
                await stream.aclose()
            finally:
                await runtime.remove([container])
    return statistics.median(times)


async def calls(env: dict[str, str], root: Path, rounds: int) -> dict[str, float]:
    """A bridge's first call from its warm pool, its warm 1+1, and the first call after a restart."""
    firsts, warms, adopted = [], [], []
    for i in range(rounds):
        state = root / f"{env.get('KERNELBRIDGE_RUNTIME', 'default')}-{i}"
        async with open_bridge(state, **env) as bridge:
            deadline = time.monotonic() + 120
            while not list((state / "warm").glob("*.json")):  # the pool's sandbox is ready
                assert time.monotonic() < deadline, "the warm pool did not fill"
                await anyio.sleep(0.05)
            first = await bridge.run("x = 1+1", "s")
            assert first.status == "ok", first.text
            firsts.append(first.seconds)
            for _ in range(10):
                warm = await bridge.run("1+1", "s")
                warms.append(warm.seconds)
        async with open_bridge(state, **env) as bridge:
            again = await bridge.run("x", "s")
            assert "adopted" in again.codes, again.text
            adopted.append(again.seconds)
            await bridge.close("s")
            for name in list(bridge.sessions):
                await bridge.close(name)
    return {
        "first": statistics.median(firsts),
        "warm": statistics.median(warms),
        "adopted": statistics.median(adopted),
    }


async def beside_podman(kubeconfig: Path, image: str, rounds: int) -> None:
    kube = {"KERNELBRIDGE_RUNTIME": "kube", "KUBECONFIG": str(kubeconfig)}
    podman_env = {"KERNELBRIDGE_RUNTIME": "podman-api"}
    cold_kube, cold_podman = (
        await cold_start(kube, image, rounds),
        await cold_start(podman_env, image, rounds),
    )
    print(
        f"cold sandbox, create to first echoed byte: kube {cold_kube:.2f} s, podman API {cold_podman:.2f} s"
    )
    with tempfile.TemporaryDirectory(prefix="kbbench-kube-") as tmp:
        on_kube = await calls(kube, Path(tmp), rounds)
        on_podman = await calls(podman_env, Path(tmp), rounds)
    ms = {k: {n: v * 1000 for n, v in d.items()} for k, d in (("kube", on_kube), ("podman", on_podman))}
    print(
        f"first call from a warm pod: kube {ms['kube']['first']:.0f} ms (target <= 50 ms), "
        f"podman API {ms['podman']['first']:.0f} ms"
    )
    print(
        f"warm 1+1: kube {ms['kube']['warm']:.1f} ms, podman API {ms['podman']['warm']:.1f} ms; "
        f"kube / podman {on_kube['warm'] / on_podman['warm']:.2f}x (target <= 1.2x)"
    )
    print(
        f"first call after a bridge restart (adopted): kube {ms['kube']['adopted']:.0f} ms, "
        f"{on_kube['adopted'] / on_kube['warm']:.2f}x its warm call (target <= 2x); podman API "
        f"{ms['podman']['adopted']:.0f} ms, {on_podman['adopted'] / on_podman['warm']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if subprocess.run([str(SCRIPT), "built"], check=False).returncode != 0:
        raise SystemExit("not built: scripts/kube-cluster.sh build")
    image = ensure_sandbox_image()
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False).returncode == 0
    started = time.monotonic()
    out = script("up", timeout=900, env={"KERNELBRIDGE_KUBE_IMAGE": image})
    if not was_up:
        print(f"up (built, image imported): {time.monotonic() - started:.1f} s")
    kubeconfig = Path(out.strip().splitlines()[-1].removeprefix("KUBECONFIG="))
    cluster = Cluster(kubeconfig=kubeconfig, run_label="app.kubernetes.io/managed-by=kernelbridge")
    try:
        pods = [timed_pod(cluster, image, i) for i in range(args.rounds)]
        engine = [podman_run(image) for _ in range(args.rounds)]
        running = statistics.median(p[0] for p in pods)
        done = statistics.median(p[1] for p in pods)
        podman = statistics.median(engine)
        print(f"sandbox pod, apply to container running: {running:.2f} s (median of {args.rounds})")
        print(f"sandbox pod, apply to Succeeded (python3 -c pass): {done:.2f} s")
        print(f"podman run --rm, same image and command: {podman:.2f} s; pod / podman: {done / podman:.1f}x")
        try:
            anyio.run(beside_podman, kubeconfig, image, args.rounds)
        finally:
            # The last bridge of each runtime lets go of its warm sandbox (it outlives the bridge).
            cluster.kubectl("-n", SANDBOX_NAMESPACE, "delete", "pods", "-l", "kernelbridge.bench=kube")
            ids = subprocess.run(
                ["podman", "ps", "-aq", "--filter", "label=kernelbridge.bench=kube"],
                capture_output=True,
                text=True,
            ).stdout.split()
            if ids:
                subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True, timeout=120)
    finally:
        if not was_up:
            started = time.monotonic()
            script("down", timeout=300)
            print(f"down: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
