"""Privilege attacks: no capability, no way up through setuid binaries or privileged system calls,
and nothing in the sandbox that holds the frame pipes (the agent, PID 1) is reachable from kernel
code: not through ``/proc``, not with ptrace, not with signals."""

from __future__ import annotations

import json
import os

import pytest
from bridge_harness import Bridge, podman

pytestmark = [pytest.mark.anyio, pytest.mark.podman]


async def test_no_capabilities_and_no_new_privileges(bridge: Bridge) -> None:
    code = r"""
import os
lines = open("/proc/self/status").read().splitlines()
status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
keys = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
verdict = {k: status[k].strip() for k in keys}
verdict["ids"] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())]
"""
    verdict = await bridge.probe(code, "priv-caps")
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(verdict[cap], 16) == 0, verdict
    assert verdict["NoNewPrivs"] == "1" and verdict["Seccomp"] == "2", verdict
    assert verdict["ids"][:4] == [65534] * 4 and 0 not in verdict["ids"][4], verdict


async def test_setuid_binaries_give_nothing(bridge: Bridge) -> None:
    code = r"""
import os, subprocess
setuid = []
for root in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_mode & 0o6000 and not os.path.islink(path):
                setuid.append(path)
        except OSError:
            pass
os.makedirs("/tmp/kbx-mnt", exist_ok=True)
mount = subprocess.run(["mount", "-t", "tmpfs", "kbx", "/tmp/kbx-mnt"], capture_output=True, text=True)
su = subprocess.run(["su", "-c", "id -u", "root"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
verdict = {
    "setuid": setuid,
    "mount": [mount.returncode, mount.stderr.strip()],
    "mounted": "/tmp/kbx-mnt" in open("/proc/self/mounts").read(),
    "su": [su.returncode, su.stdout.strip()],
}
"""
    verdict = await bridge.probe(code, "priv-setuid")
    assert "/usr/bin/mount" in verdict["setuid"]  # the image has them: they must be harmless
    assert verdict["mount"][0] != 0 and not verdict["mounted"], verdict
    assert verdict["su"][0] != 0 and verdict["su"][1] != "0", verdict


async def test_a_user_namespace_gives_nothing_outside_it(bridge: Bridge) -> None:
    # podman's default seccomp profile lets unprivileged code create a user namespace (docker's
    # does not): its "root" holds capabilities over that namespace only. Observed: nothing of
    # the sandbox's boundary moves.
    code = r"""
import subprocess
def inside(script):
    run = subprocess.run(["unshare", "-r", "-n", "-m", "sh", "-c", script], capture_output=True, text=True)
    return [run.returncode, run.stdout.strip(), run.stderr.strip()[-200:]]
verdict = {
    "id": inside("id -u"),
    "write_root": inside("echo x > /etc/kbx && echo written"),
    "agent_environ": inside("cat /proc/1/environ >/dev/null && echo read"),
    "agent_fd": inside("ls /proc/1/fd >/dev/null && echo listed"),
    "interfaces": inside("ls /sys/class/net"),
    "host_mount": inside("mount -t proc proc /tmp 2>/dev/null && ls /tmp | grep -c '^[0-9]'"),
}
"""
    verdict = await bridge.probe(code, "priv-userns")
    assert verdict["id"][1] == "0", verdict  # the namespace exists (documented, see above)
    assert "written" not in verdict["write_root"][1], verdict
    assert "read" not in verdict["agent_environ"][1], verdict
    assert "listed" not in verdict["agent_fd"][1], verdict
    assert verdict["interfaces"][1].split() == ["lo"], verdict


async def test_privileged_system_calls_are_refused(bridge: Bridge) -> None:
    code = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    result = getattr(libc, name)(*args)
    return "ok" if result == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def py(fn, *args):
    try:
        fn(*args)
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, "?")
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
verdict = {
    "setuid0": py(os.setuid, 0),
    "setgid0": py(os.setgid, 0),
    "chroot": py(os.chroot, "/tmp"),
    "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, None),
    "unshare_user": call("unshare", CLONE_NEWUSER),
    "unshare_mount": call("unshare", CLONE_NEWNS),
    "unshare_net": call("unshare", CLONE_NEWNET),
    "sethostname": call("sethostname", b"kbx", 3),
    "mknod": py(os.mknod, "/tmp/kbx-null", 0o20666, os.makedev(1, 3)),
}
"""
    verdict = await bridge.probe(code, "priv-syscalls")
    assert "ok" not in verdict.values(), verdict


def agent_pipes(container: str) -> set[str]:
    """The pipe inodes of the agent's stdio (PID 1 of the container), read on the host as root."""
    info = json.loads(podman("container", "inspect", container))[0]
    pid = info["State"]["Pid"]
    return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1)}


async def test_proc_of_the_agent_is_closed_to_kernel_code(bridge: Bridge) -> None:
    session = "priv-proc"
    await bridge.run("1", session)
    pipes = agent_pipes(await bridge.container(session))
    code = r"""
import errno, os
def attempt(path, how):
    try:
        if how == "list":
            os.listdir(path)
        elif how == "read":
            with open(path, "rb") as f:
                f.read(1)
        elif how == "write":
            with open(path, "wb") as f:
                f.write(b"{}\n")
        elif how == "readlink":
            os.readlink(path)
        return "allowed"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
verdict = {"pid1": {}, "seen": []}
for path, how in [("/proc/1/fd", "list"), ("/proc/1/fd/0", "read"), ("/proc/1/fd/1", "write"),
                  ("/proc/1/fd/0", "readlink"), ("/proc/1/fdinfo", "list"), ("/proc/1/mem", "read"),
                  ("/proc/1/environ", "read"), ("/proc/1/root", "list"), ("/proc/1/cwd", "list"),
                  ("/proc/1/map_files", "list")]:
    verdict["pid1"][f"{how} {path}"] = attempt(path, how)
# Every fd of every process this code can see: none may be the agent's stdio.
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            verdict["seen"].append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
"""
    verdict = await bridge.probe(code, session)
    assert "allowed" not in verdict["pid1"].values(), verdict["pid1"]
    assert not pipes & set(verdict["seen"]), (pipes, verdict["seen"])
    assert any(link.startswith("pipe:") for link in verdict["seen"])  # the probe saw pipes at all


async def test_ptrace_and_memory_reads_of_the_agent_are_refused(bridge: Bridge) -> None:
    code = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
def ptrace(request, pid):
    result = libc.ptrace(request, pid, None, None)
    return "ok" if result == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(0x400000, 64)
read = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
verdict = {
    "attach": ptrace(PTRACE_ATTACH, 1),
    "seize": ptrace(PTRACE_SEIZE, 1),
    "vm_readv": "ok" if read >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"),
}
"""
    verdict = await bridge.probe(code, "priv-ptrace")
    assert verdict == {"attach": "EPERM", "seize": "EPERM", "vm_readv": "EPERM"}, verdict


SIGNAL_PID1 = r"""
import os, signal, time
sent = []
for name in NAMES:
    try:
        os.kill(1, getattr(signal, name))
        sent.append(name)
    except OSError as exc:
        sent.append(f"{name}: {exc.errno}")
time.sleep(0.5)
verdict = sent
"""


async def test_signals_to_the_agent_do_not_stop_it(bridge: Bridge) -> None:
    session = "priv-signals"
    await bridge.run("kept = 42", session)
    names = ["SIGKILL", "SIGSTOP", "SIGSEGV", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM"]
    await bridge.probe(f"NAMES = {names!r}\n" + SIGNAL_PID1, session)
    after = await bridge.run("kept", session)
    assert after.status == "ok" and after.data["result"] == "42", after.text


async def test_sigterm_to_the_agent_ends_only_that_sandbox_and_is_reported(bridge: Bridge) -> None:
    session = "priv-sigterm"
    await bridge.run("open('/workspace/f', 'w').write('x')", session)
    ended = await bridge.run("import os, signal, time\nos.kill(1, signal.SIGTERM)\ntime.sleep(10)", session)
    assert ended.status == "kernel_died" and ended.data["state"] == "lost", ended.text
    assert set(ended.codes) & {"sandbox_died", "not_sent"}, ended.notes  # variables and files lost
    fresh = await bridge.run("import os; os.listdir('/workspace')", session)
    assert fresh.status == "ok" and fresh.data["result"] == "[]"
    assert fresh.codes == ["fresh_sandbox"], fresh.notes
    assert (await bridge.run("1", "priv-bystander")).status == "ok"
