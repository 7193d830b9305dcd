"""``/usr/bin/python3 -I -S <image>/kernelbridge/inside/handover.py``: give the agent a new attachment.

Exec'd in the container by a bridge that adopts the sandbox, as :data:`RELAY_UID`, with its stdin and
stdout attached: it checks that the listener of the agent's attach point is the agent (PID 1), passes
it its stdin and stdout (``SCM_RIGHTS``) and waits until the agent closes the connection (the
attachment lives as long as this process). It reads and writes nothing on the pipes and never sees
the sandbox's secret. Design: docs/design/sandbox.md, "Adoption".

Exit status: 0 when the agent ended the attachment, 3 when the listener is not the agent, 4 when
no agent listens (one line on stderr says why). Standard library only; nothing else of
kernelbridge is imported (the agent and the host import its constants).
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import struct
import sys
import time

SOCKET_ENV = "KERNELBRIDGE_ATTACH_SOCKET"
"""The abstract socket's name (set only by the local test double: every "container" there
shares the host's network namespace, where abstract names are kept)."""
DEFAULT_SOCKET = "kernelbridge-agent"
AGENT_PID_ENV = "KERNELBRIDGE_AGENT_PID"
"""The agent's pid as this process sees it (1 in a container; the test double sets it)."""
RELAY_UID = 65533
"""The uid (and gid) handovers run as, and the only one the agent takes an attachment from: not
the kernel's 65534, not root (docs/architecture.md, "Adoption"). No file in the image is its."""
CONNECT_TIMEOUT = 5.0
"""The agent accepts within one turn of its loop (200 ms); a backlog filled by kernel code's own
connections is drained each turn too."""
PR_SET_DUMPABLE = 4


def socket_address(name: str) -> str:
    """An abstract address: the leading NUL keeps it out of the file system (nothing to plant)."""
    return "\0" + name


def main() -> int:
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    address = socket_address(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
    expected_pid = int(os.environ.get(AGENT_PID_ENV) or "1")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        try:
            conn.connect(address)
            break
        except (ConnectionRefusedError, BlockingIOError, FileNotFoundError) as exc:
            if time.monotonic() > deadline:
                print(f"kernelbridge handover: no agent listens ({exc})", file=sys.stderr)
                return 4
            time.sleep(0.02)
    pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if pid != expected_pid:
        print(f"kernelbridge handover: the listener is process {pid}, not the agent", file=sys.stderr)
        return 3
    conn.sendmsg([b"H"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1]))])
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    with contextlib.suppress(OSError):
        conn.recv(1)  # until the agent closes it: the attachment is over
    return 0


if __name__ == "__main__":
    sys.exit(main())
