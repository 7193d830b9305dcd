"""Resource attacks: fork and memory bombs, a CPU hog, deep recursion, closed stdio, threads
printing after their cell, gigabytes of output, output while no call runs. The sandbox's limits
contain each one; the bridge's memory stays bounded; other sessions carry on."""

from __future__ import annotations

import pytest
from bridge_harness import Bridge
from peers.hostile_cells import HOG, HOG_SHARE

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

MiB = 1024


async def test_a_fork_bomb_is_contained(bridge: Bridge) -> None:
    session = "res-forkbomb"
    code = r"""
import os, time
children = 0
for _ in range(10_000):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    except OSError:
        break
print("forked", children)
"""
    result = await bridge.run(code, session, timeout=20)
    assert result.status == "ok", result.text
    forked = int(result.stdout.split()[-1])
    assert 0 < forked < 128  # the pids limit stopped it
    assert (await bridge.run("1 + 1", "res-bystander")).data["result"] == "2"
    await bridge.close(session)  # the sleeping children go with the sandbox


async def test_a_memory_bomb_kills_only_its_kernel_and_says_so(bridge: Bridge) -> None:
    session = "res-membomb"
    await bridge.run("open('/workspace/f', 'w').write('x')", session)
    before = bridge.rss_kib()
    result = await bridge.run(
        "x = bytearray(2 << 30)\nx[::4096] = b'1' * len(x[::4096])", session, timeout=60
    )
    assert result.status == "kernel_died" and result.data["state"] == "lost", result.text
    # The death's reason (the host's one line) names the memory limit; the note says what is lost.
    assert result.codes == ["sandbox_died"] and "memory" in result.notes, result.notes
    assert bridge.rss_kib() < before + 64 * MiB
    fresh = await bridge.run("import os; os.listdir('/workspace')", session)
    assert fresh.status == "ok" and fresh.data["result"] == "[]" and fresh.codes == ["fresh_sandbox"]


async def test_killing_the_kernels_process_group_is_not_called_out_of_memory(bridge: Bridge) -> None:
    session = "res-killpg"
    result = await bridge.run("import os, signal\nos.killpg(0, signal.SIGKILL)", session, timeout=30)
    assert result.status == "kernel_died", result.text
    assert result.codes == ["sandbox_died"], result.notes
    assert "SIGKILL" in result.notes and "memory" not in result.notes, result.notes


CPU_LIMIT = 1.0
"""The default ``KERNELBRIDGE_CPUS``; four busy processes on this 2-core machine would use ~2."""
HOGS_RAN = 0.3
"""The share that shows the hogs ran at all (else the limit's check would hold of idle hogs)."""
SHARE_ATTEMPTS = 3
"""Samples of the share: on a machine busy with the suite's other workers, the hogs' cgroup is one
among many and may get less than ``HOGS_RAN`` in a 3 s sample (0.25 seen in CI); the limit is
checked in every sample, that they ran in any."""


async def test_a_cpu_hog_is_held_to_its_limit_and_another_session_carries_on(bridge: Bridge) -> None:
    calm, hog = "res-calm", "res-hog"
    await bridge.run("1", calm)
    assert (await bridge.run(HOG, hog)).stdout == "4 hogs\n"
    shares = []
    for _ in range(SHARE_ATTEMPTS):
        shares.append(float((await bridge.run(HOG_SHARE, hog, timeout=30)).data["result"]))
        assert shares[-1] <= CPU_LIMIT * 1.15, shares  # the limit holds in every sample
        if shares[-1] > HOGS_RAN:
            break
    assert max(shares) > HOGS_RAN, shares
    # The bridge serves the calm session while the hog's session holds a core (how much slower
    # its calls are meanwhile: bench/bench_neighbours.py).
    for n in range(10):
        assert (await bridge.run(f"{n} + 1", calm)).data["result"] == str(n + 1)
    await bridge.close(hog)
    print(f"\ncpu hog: {max(shares)} CPUs")


async def test_deep_recursion_is_an_ordinary_error(bridge: Bridge) -> None:
    session = "res-recursion"
    result = await bridge.run("def f(n): return f(n + 1)\nf(0)", session)
    assert result.status == "error" and result.data["error"]["ename"] == "RecursionError"
    assert len(result.text) < 30_000  # a megabyte traceback is cut
    assert (await bridge.run("'alive'", session)).data["result"] == "'alive'"


async def test_unbounded_recursion_kills_the_kernel_and_says_why(bridge: Bridge) -> None:
    session = "res-unbounded-recursion"
    # Python 3.11 frames live on the heap: without the recursion limit this eats memory (or the C
    # stack, in C code) until the kernel dies; the result must say which.
    code = "import sys\nsys.setrecursionlimit(10**7)\ndef f(n): return f(n + 1)\nf(0)"
    result = await bridge.run(code, session, timeout=60)
    assert result.status == "kernel_died" and result.data["state"] == "lost", result.text
    assert "out of memory" in result.notes or "SIGSEGV" in result.notes, result.notes
    assert (await bridge.run("1", session)).status == "ok"


async def test_closing_stdout_and_stderr(bridge: Bridge) -> None:
    session = "res-closed-stdio"
    closed = await bridge.run("import os, sys\nos.close(1)\nos.close(2)\nsys.stdout.close()", session)
    assert closed.status in ("ok", "error"), closed.text
    after = await bridge.run("print('still printing')\n'value'", session)
    assert after.status == "ok" and after.data["result"] == "'value'", after.text
    assert (await bridge.run("1", "res-bystander")).status == "ok"


async def test_a_thread_printing_after_its_cell(bridge: Bridge) -> None:
    session = "res-thread"
    code = r"""
import threading, time
def later():
    time.sleep(1)
    for i in range(5):
        print("late", i, flush=True)
threading.Thread(target=later, daemon=True).start()
"""
    await bridge.run(code, session)
    result = await bridge.run("import time; time.sleep(3)\n'next'", session)
    assert result.status == "ok" and result.data["result"] == "'next'"
    # The late lines are reported with this call, never lost and never mixed into another session.
    assert "late 4" in result.stdout or "background_output" in result.codes, result.text
    assert "late 4" in result.stdout + result.notes, result.text
    other = await bridge.run("'other'", "res-bystander")
    assert "late" not in other.text


async def test_gigabytes_of_output_are_capped(bridge: Bridge) -> None:
    session = "res-output"
    before = bridge.rss_kib()
    code = "import sys\nchunk = 'x' * (1 << 20) + '\\n'\nfor _ in range(2048):\n    sys.stdout.write(chunk)"
    result = await bridge.run(code, session, timeout=300)
    assert result.status == "ok", result.text
    assert result.data["truncated"] is True
    assert len(result.stdout) < 100_000
    assert bridge.rss_kib() < before + 100 * MiB
    assert (await bridge.run("'alive'", session)).data["result"] == "'alive'"


BACKGROUND_FLOOD = r"""
import threading, time, uuid
k = get_ipython().kernel
def flood():
    for i in range(COUNT):
        parent = {"header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "session": "s"}}
        k.session.send(k.iopub_socket, "display_data",
                       {"data": {"text/plain": "q" * (2 << 20)}, "metadata": {}},
                       parent=parent, ident=b"kernel.display_data")
        time.sleep(0.02)
    sys_out = __import__("sys").stdout
    sys_out.set_parent({"header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request"}})
    sys_out.write("background text\n")
    sys_out.flush()
flooder = threading.Thread(target=flood, daemon=True)
flooder.start()
"""


async def test_background_output_while_idle_is_bounded_and_reported_once(bridge: Bridge) -> None:
    session = "res-background"
    await bridge.run("1", session)
    before = bridge.rss_kib()
    # 300 displays of 2 MiB arrive while no call runs: the attack, shortened. 600 MiB is
    # 1.5x the bound on the bridge's peak below, which a bridge that kept what arrives would exceed.
    await bridge.run("COUNT = 300\n" + BACKGROUND_FLOOD, session)
    waited = await bridge.run("import time; time.sleep(5)", "res-bystander", timeout=60)
    assert waited.status == "ok"
    # Wait for the end of the flood (bounded); its output keeps arriving outside any cell.
    joined = await bridge.run("flooder.join(240)\nflooder.is_alive()", session, timeout=300)
    peak_growth = bridge.peak_kib() - before
    print("background flood: bridge rss before", before, "peak growth", peak_growth)
    assert peak_growth < 400 * MiB, peak_growth
    assert bridge.rss_kib() < before + 100 * MiB
    if joined.status != "ok":  # the flood cost the sandbox its memory: its own limit, said so
        assert "sandbox_died" in joined.codes and "memory" in joined.notes, joined.text
        return
    assert joined.data["result"] == "False"
    report = await bridge.run("'next'", session)
    print("background report:", report.status, report.notes[:300])
    assert report.status == "ok" and "background_output" in report.codes, report.text
    again = await bridge.run("'again'", session)
    assert "background_output" not in again.codes, again.text
