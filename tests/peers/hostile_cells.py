"""Hostile cells, shared by the security suite (tests/security/test_tenants.py,
test_resources.py) and the benchmarks (bench/bench_tenants.py, bench_neighbours.py), so that the
test and the benchmark measure the same attack."""

FORGE_SECONDS = 8
FLOOD = r"""
import threading, time, uuid
k = get_ipython().kernel
png = "A" * ((4 << 20) - 16)
code = "import time; time.sleep(20)  # typed by a person " + "x" * (1 << 20)
def flood():
    end, n = time.monotonic() + SECONDS, 0
    while time.monotonic() < end:
        parent = {"header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request",
                             "session": "console", "username": "a person"}}
        k.session.send(k.iopub_socket, "status", {"execution_state": "busy"}, parent=parent)
        k.session.send(k.iopub_socket, "execute_input", {"code": code, "execution_count": 1}, parent=parent)
        for _ in range(4):
            k.session.send(k.iopub_socket, "display_data", {"data": {"image/png": png}, "metadata": {}},
                           parent=parent)
        k.session.send(k.iopub_socket, "status", {"execution_state": "idle"}, parent=parent)
        n += 1
        time.sleep(0.5)  # ~34 MiB/s, what the tunnel carries: faster only fills the kernel's queue
    open("/workspace/flood.done", "w").write(str(n))
threading.Thread(target=flood, daemon=True).start()
"""

BIG_CELL = """
import os, base64
from IPython.display import display
for _ in range(3):
    display({"image/png": base64.b64encode(os.urandom(3 * (1 << 20) - 1024)).decode()}, raw=True)
"""


def flood(seconds: float = FORGE_SECONDS) -> str:
    """The forging cell: a background thread announcing ~17 MiB "cells of another client" (busy, 1 MB
    of execute_input code, four ~4 MiB PNGs, idle), two a second for ``seconds``, then writing how
    many to /workspace/flood.done."""
    return FLOOD.replace("SECONDS", repr(seconds))


HOG = r"""
import signal, subprocess, sys
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
print(len(hogs), "hogs")
"""
HOGS_OFF = "for h in hogs: h.send_signal(signal.SIGSTOP)"
HOGS_ON = "for h in hogs: h.send_signal(signal.SIGCONT)"


HOG_SHARE = r"""
import os, time
def cpu_seconds():
    ticks = 0
    for h in hogs:
        fields = open(f"/proc/{h.pid}/stat").read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")
began, used = time.monotonic(), cpu_seconds()
time.sleep(3)
round((cpu_seconds() - used) / (time.monotonic() - began), 2)
"""
"""The CPUs the four hogs used together over 3 s of wall time."""
