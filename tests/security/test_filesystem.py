"""File system attacks: the root is read-only, every writable mount is a sized tmpfs, and no host
path is visible inside the sandbox."""

from __future__ import annotations

import pytest
from bridge_harness import REPO, Bridge

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

MiB = 1024 * 1024
WRITABLE = {"/tmp": 64 * MiB, "/workspace": 256 * MiB, "/packages": 192 * MiB, "/dev/shm": 64 * MiB}
"""Every mount sandboxed code may write to, with its size (the defaults of SandboxLimits; /packages
is where `%pip install` puts what the host sends; /dev/shm is the engine's 64m default)."""

WRITE_ATTEMPTS = r"""
import errno, os
def attempt(path):
    try:
        if path.endswith("/"):
            os.mkdir(path + "kbx-dir")
            return "created"
        with open(path, "a") as f:
            f.write("x")
        return "written"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
verdict = {path: attempt(path) for path in PATHS}
"""

OUTSIDE_TMPFS = [
    "/kbx",
    "/",
    "/etc/passwd",
    "/etc/kbx",
    "/usr/bin/python3",
    "/usr/lib/",
    "/opt/kernelbridge/kernelbridge/inside/agent/__main__.py",
    "/opt/kernelbridge/kernelbridge/frames.py",
    "/var/tmp/kbx",
    "/var/tmp/",
    "/run/kbx",
    "/run/",
    "/dev/kbx",
    "/home/",
    "/root/",
    "/proc/sys/kernel/hostname",
    "/proc/sysrq-trigger",
    "/sys/fs/cgroup/kbx",
    "/etc/hosts",
    "/etc/resolv.conf",
]


async def test_nothing_outside_the_tmpfs_mounts_is_writable(bridge: Bridge) -> None:
    verdict = await bridge.probe(f"PATHS = {OUTSIDE_TMPFS!r}\n" + WRITE_ATTEMPTS, "fs-outside")
    written = {path: outcome for path, outcome in verdict.items() if outcome in ("written", "created")}
    assert not written, verdict
    assert set(verdict.values()) <= {"EROFS", "EACCES", "EPERM", "ENOENT", "EEXIST"}, verdict


FIND_WRITABLE = r"""
import os
mounts = [line.split()[1] for line in open("/proc/self/mounts")]
writable = []
for mount in mounts:
    if not os.path.isdir(mount) or not os.access(mount, os.W_OK):
        continue
    probe = os.path.join(mount, ".kbx-probe")
    try:
        with open(probe, "w") as f:
            f.write("x")
        os.unlink(probe)
        writable.append(mount)
    except OSError:
        pass
verdict = sorted(set(writable))
"""

FILL = r"""
import errno, os, time
start = time.monotonic()
chunk = b"\0" * (1 << 20)
written, outcome = 0, "no error"
path = os.path.join(MOUNT, "kbx-fill")
try:
    with open(path, "wb", buffering=0) as f:
        while written < LIMIT * 2:
            f.write(chunk)
            written += len(chunk)
except OSError as exc:
    outcome = errno.errorcode.get(exc.errno, str(exc))
finally:
    if os.path.exists(path):
        os.unlink(path)
verdict = {"written": written, "outcome": outcome, "seconds": time.monotonic() - start}
"""


async def test_the_writable_mounts_are_exactly_the_sized_tmpfs(bridge: Bridge) -> None:
    assert await bridge.probe(FIND_WRITABLE, "fs-writable") == sorted(WRITABLE)


@pytest.mark.parametrize("mount", sorted(WRITABLE))
async def test_filling_a_writable_mount_stops_at_its_size(bridge: Bridge, mount: str) -> None:
    size = WRITABLE[mount]
    session = "fs-fill"
    verdict = await bridge.probe(f"MOUNT = {mount!r}\nLIMIT = {size}\n" + FILL, session, timeout=120)
    assert verdict["outcome"] == "ENOSPC", verdict
    assert size - 2 * MiB <= verdict["written"] <= size, verdict
    # The session goes on (the file was removed), and so does every other session.
    assert (await bridge.run("'still here'", session)).data["result"] == "'still here'"
    assert (await bridge.run("1 + 1", "fs-bystander")).data["result"] == "2"


async def test_no_host_path_is_visible(bridge: Bridge) -> None:
    host_paths = [
        str(REPO),
        str(bridge.state_dir),
        "/work",
        "/root/.ssh",
        "/var/lib/containers",
        "/proc/1/root/work",
    ]
    code = (
        f"HOST = {host_paths!r}\n"
        + r"""
import os
binds = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    fstype = fields[fields.index("-") + 1]
    # A mount of a host file system (not proc, sysfs, tmpfs, cgroup, the image's overlay root).
    if fstype not in ("proc", "sysfs", "tmpfs", "cgroup", "cgroup2", "devpts", "mqueue", "overlay"):
        binds.append(fields[4])
binds.sort()
verdict = {"visible": [p for p in HOST if os.path.exists(p)], "bind_mounts": binds}
"""
    )
    verdict = await bridge.probe(code, "fs-host")
    assert verdict["visible"] == [], verdict
    # The engine binds its own three generated files and nothing else of the host.
    assert set(verdict["bind_mounts"]) <= {
        "/etc/hosts",
        "/etc/hostname",
        "/etc/resolv.conf",
        "/run/.containerenv",
    }, verdict
