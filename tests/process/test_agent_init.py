"""The agent's PID-1 reaper (kernelbridge/inside/agent/init.py) on real zombies: children of
this process that exited, some kept for their owner to read, one an orphan to reap."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from kernelbridge.inside.agent import init

BOUND = 10.0


def test_zombies_are_found_and_reaped_but_kept_ones_are_not() -> None:
    children = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    kept, orphan = (child.pid for child in children)
    deadline = time.monotonic() + BOUND
    while len(set(init.zombie_children(os.getpid())) & {kept, orphan}) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert {kept, orphan} <= set(init.zombie_children(os.getpid()))
    assert init.reap_orphans(keep=[kept, *_other_children(kept, orphan)]) == 1
    zombies = set(init.zombie_children(os.getpid()))
    assert orphan not in zombies and kept in zombies
    assert children[0].wait(BOUND) == 0  # its owner still reads its status


def _other_children(*ours: int) -> list[int]:
    """Zombies of this process that are not the test's (kept: someone else reads them)."""
    return [pid for pid in init.zombie_children(os.getpid()) if pid not in ours]
