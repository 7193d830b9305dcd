"""Attacks on the adoption of a sandbox that outlived its bridge (issue 23), with real bridges, real
MCP clients over stdio and HTTP, and real podman sandboxes.

- Kernel code plants Python everywhere it can write (a ``kernelbridge`` package shadowing the
  handover, the standard-library modules the handover imports, ``sitecustomize``,
  ``usercustomize``, ``.pth`` files, in /workspace, /tmp, its ``$HOME``'s user site, /packages,
  /dev/shm), then the bridge restarts: the adoption succeeds and none of it ran in any process
  but the kernel's own. The handover the kernel can then see runs as the relay uid, isolated, and
  out of its reach; the agent imports nothing from its working directory; the attach point's
  name cannot be taken.
- Another HTTP token holding a copy of a session's record and secret adopts nothing (labels), and
  a bridge whose record matches the labels but not the secret is refused by the agent (the
  proof); the owner adopts its sandbox afterwards as if nothing happened.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge, open_http_bridge
from durable_harness import DURABLE, remove_sandboxes_of, running, sandboxes_of, wait_for

from kernelbridge.config import load_settings
from kernelbridge.errors import AdoptionFailed
from kernelbridge.host import Sandbox, SandboxHandlers
from kernelbridge.host.container import HANDOVER_COMMAND
from kernelbridge.inside.handover import RELAY_UID
from kernelbridge.runtime.select import open_runtime
from kernelbridge.session.store import SessionStore

pytestmark = pytest.mark.anyio

MARKS = "/tmp/marks"
"""Where planted code leaves a mark if it runs: a file named after its pid, uid and place."""
WRITABLE = (
    "/workspace",
    "/tmp",
    "/tmp/.local/lib/python3.11/site-packages",  # the user site of $HOME=/tmp
    "/packages",
    "/packages/site",
    "/dev/shm",
)
"""Every directory kernel code (uid 65534) can write in its sandbox."""
CHAINED = ("socket", "struct", "array", "contextlib", "time", "ctypes")
"""The standard-library modules the handover imports: a shadow marks, then hands over the real
module, so that an adoption through a handover that imported one still succeeds."""
REAL_HANDOVER = "/opt/kernelbridge/kernelbridge/inside/handover.py"


@pytest.fixture
def state(tmp_path: Path, sandbox_image: str) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    remove_sandboxes_of(state_dir)


def mark(place: str) -> str:
    """One line of Python (also a valid ``.pth`` line) that leaves a mark in :data:`MARKS`."""
    label = place.strip("/").replace("/", "_")
    return (
        f"import os; os.close(os.open({MARKS!r} + '/%d-uid%d-{label}' % (os.getpid(), os.getuid()),"
        " os.O_WRONLY | os.O_CREAT, 0o644))"
    )


def guarded(place: str) -> str:
    """A module that marks, and fails silently where it cannot."""
    return f"try:\n    {mark(place)}\nexcept OSError:\n    pass\n"


def chained(place: str) -> str:
    """A shadow of a standard-library module: it marks, then puts the real module in its place."""
    return guarded(place) + (
        "import importlib as _i, os as _o, sys as _s\n"
        f"_planted = {WRITABLE!r}\n"
        "_s.modules.pop(__name__, None)\n"
        "_saved = list(_s.path)\n"
        "_here = ('', '.', _o.getcwd())\n"
        "_s.path[:] = [p for p in _s.path if p not in _here and not p.startswith(_planted)]\n"
        "try:\n    _real = _i.import_module(__name__)\nfinally:\n    _s.path[:] = _saved\n"
        "_s.modules[__name__] = _real\n"
    )


def planted_files() -> dict[str, str]:
    """Path -> content of everything the cell plants."""
    files: dict[str, str] = {}
    for where in WRITABLE:
        files[f"{where}/kernelbridge/__init__.py"] = guarded(f"{where}/kernelbridge")
        files[f"{where}/kernelbridge/inside/__init__.py"] = guarded(f"{where}/kernelbridge/inside")
        # The shadow runs the real handover, so that the adoption still says "adopted".
        files[f"{where}/kernelbridge/inside/handover.py"] = guarded(f"{where}/handover") + (
            f"import runpy\nrunpy.run_path({REAL_HANDOVER!r}, run_name='__main__')\n"
        )
        files[f"{where}/sitecustomize.py"] = guarded(f"{where}/sitecustomize")
        files[f"{where}/usercustomize.py"] = guarded(f"{where}/usercustomize")
        files[f"{where}/zz-planted.pth"] = mark(f"{where}/pth") + "\n"
        for name in CHAINED:
            target = f"{where}/{name}/__init__.py" if name == "ctypes" else f"{where}/{name}.py"
            files[target] = chained(f"{where}/{name}")
    return files


PLANT = """
import json, os
os.makedirs(MARKS, exist_ok=True)
os.chmod(MARKS, 0o777)  # any uid may leave its mark (no sticky bit: /tmp's would stop root)
for path, content in json.loads(FILES).items():
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(content)
verdict = {"planted": len(json.loads(FILES))}
import socket
squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    squatter.bind("\\0kernelbridge-agent")
    verdict["squat"] = "bound"
except OSError as exc:
    verdict["squat"] = exc.strerror
squatter.close()
"""

LOOK = """
import os
verdict = {"kernel": os.getpid(), "marks": sorted(os.listdir(MARKS)), "handovers": []}
verdict["agent"] = open("/proc/1/cmdline", "rb").read().split(b"\\0")[:-1]
verdict["agent"] = [part.decode() for part in verdict["agent"]]
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[:-1]
    except OSError:
        continue
    if not any(b"handover" in part for part in argv):
        continue
    seen = {"argv": [part.decode() for part in argv]}
    status = open(f"/proc/{pid}/status").read()
    seen["uid"] = [line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")][0]
    for what, attempt in (
        ("signal", lambda: os.kill(int(pid), 0)),
        ("fds", lambda: os.listdir(f"/proc/{pid}/fd")),
        ("cwd", lambda: os.readlink(f"/proc/{pid}/cwd")),
        ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
    ):
        try:
            attempt()
            seen[what] = "allowed"
        except PermissionError:
            seen[what] = "refused"
    verdict["handovers"].append(seen)
"""


async def test_code_planted_by_the_sandbox_never_runs_in_the_adoption(state: Path) -> None:
    files = planted_files()
    async with open_bridge(state, **DURABLE) as bridge:
        planted = await bridge.probe(f"MARKS = {MARKS!r}\nFILES = {json.dumps(files)!r}\n" + PLANT, "s")
        assert planted == {"planted": len(files), "squat": "Address already in use"}, planted
        container = await bridge.container("s")
    await wait_for(lambda: running(container), "the sandbox runs on")

    async with open_bridge(state, **DURABLE) as bridge:
        first = await bridge.run("print('still here')", "s")
        assert first.status == "ok" and first.stdout == "still here\n", first.text
        assert "adopted" in first.codes, first.text
        seen = await bridge.probe(f"MARKS = {MARKS!r}\n" + LOOK, "s")
        # Nothing planted ran anywhere but in the kernel itself (which may import its own plants).
        foreign = [name for name in seen["marks"] if not name.startswith(f"{seen['kernel']}-")]
        assert foreign == [], foreign
        assert "-P" in seen["agent"], seen["agent"]  # the agent never imports from /workspace
        (handover,) = seen["handovers"]
        assert handover["argv"] == list(HANDOVER_COMMAND), handover
        assert handover["uid"] == [str(RELAY_UID)] * 4 and RELAY_UID not in (0, 65534), handover
        assert {handover[k] for k in ("signal", "fds", "cwd", "environ")} == {"refused"}, handover
        await bridge.close("s")


async def test_another_token_with_a_copy_of_the_record_and_secret_adopts_nothing(state: Path) -> None:
    tokens = {"alice": "a" * 32, "bob": "b" * 32}
    async with open_http_bridge(state, tokens, **DURABLE) as bridges:
        assert (await bridges["alice"].run("who = 'alice'", "notes")).status == "ok"
    alice, bob = state / "http" / "alice", state / "http" / "bob"
    await wait_for(lambda: len(sandboxes_of(alice, every=False)) == 1, "alice's sandbox runs on")
    # Bob's namespace gets alice's record and secret (a shared disk, a careless backup).
    shutil.copytree(alice / "sessions", bob / "sessions", dirs_exist_ok=True)
    async with open_http_bridge(state, tokens, **DURABLE) as bridges:
        stolen = await bridges["bob"].run("print(globals().get('who'))", "notes")
        assert "sandbox_lost" in stolen.codes and "not this session's" in stolen.notes, stolen.text
        fresh = await bridges["bob"].run("print(globals().get('who'))", "notes")
        assert fresh.stdout == "None\n", fresh.text
        mine = await bridges["alice"].run("print(who)", "notes")
        assert mine.stdout == "alice\n" and "adopted" in mine.codes, mine.text
        for name in ("alice", "bob"):
            await bridges[name].close("notes")


async def test_a_bridge_with_the_labels_right_and_the_secret_wrong_is_refused_by_the_agent(
    state: Path,
) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("kept = 7", "s")).status == "ok"
    record = SessionStore(state).current("s")
    assert record is not None and record.container_id is not None
    settings = load_settings({"KERNELBRIDGE_STATE_DIR": str(state), **DURABLE})
    async with open_runtime(settings) as runtime, anyio.create_task_group() as tg:
        thief = Sandbox.adopt(
            settings, runtime, "s", container_id=record.container_id, container_name=record.container or "",
            container_label=record.container_label, secret="ab" * 32, agent_hash=None,
        )  # fmt: skip
        with pytest.raises(AdoptionFailed) as caught, anyio.fail_after(60):
            await tg.start(thief.run, SandboxHandlers())
    said = str(caught.value)
    assert "refused it" in said and "does not match" in said and "\n" not in said, said
    assert sandboxes_of(state, every=False) == [record.container_id[:12]]  # it runs on, untouched
    async with open_bridge(state, **DURABLE) as bridge:
        mine = await bridge.run("print(kept)", "s")
        assert mine.stdout == "7\n" and "adopted" in mine.codes, mine.text
        await bridge.close("s")
