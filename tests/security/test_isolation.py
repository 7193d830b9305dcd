"""One session never sees another's state, files, processes or outputs (tool answers: see
test_host_mcp.py), even while both run at once."""

from __future__ import annotations

import anyio
import pytest
from bridge_harness import Bridge

pytestmark = [pytest.mark.anyio, pytest.mark.podman]


async def test_state_files_and_processes_are_per_session(bridge: Bridge) -> None:
    setup = r"""
import subprocess, sys
secret = "alpha-secret"
open("/workspace/secret.txt", "w").write(secret)
open("/tmp/secret.txt", "w").write(secret)
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # alpha-marker"])
"""
    assert (await bridge.run(setup, "iso-alpha")).status == "ok"
    look = r"""
import os
cmdlines = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
verdict = {
    "variable": "secret" in globals(),
    "workspace": os.path.exists("/workspace/secret.txt"),
    "tmp": os.path.exists("/tmp/secret.txt"),
    "processes": [c for c in cmdlines if "alpha-marker" in c],
}
"""
    verdict = await bridge.probe(look, "iso-beta")
    assert verdict == {"variable": False, "workspace": False, "tmp": False, "processes": []}, verdict
    await bridge.close("iso-alpha")


async def test_outputs_never_cross_sessions_under_concurrency(bridge: Bridge) -> None:
    sessions = [f"iso-out-{i}" for i in range(3)]
    results: dict[str, list] = {s: [] for s in sessions}

    async def chatter(session: str) -> None:
        for i in range(10):
            code = f"import time\nfor j in range(20):\n    print('{session}', {i}, j, flush=True)\n"
            code += "    time.sleep(0.002)"
            results[session].append(await bridge.run(code, session))

    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(chatter, session)
    for session, answers in results.items():
        for i, answer in enumerate(answers):
            lines = answer.stdout.splitlines()
            assert lines == [f"{session} {i} {j}" for j in range(20)], (session, i, answer.stdout[:500])
    for session in sessions:
        await bridge.close(session)
