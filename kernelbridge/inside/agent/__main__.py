"""``python -m kernelbridge.inside.agent``: the sandbox agent, the container's PID 1 (the image's CMD)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from kernelbridge.inside.agent import init
from kernelbridge.inside.agent.host_link import OUTPUT_DRAIN_TIMEOUT, HostLink
from kernelbridge.inside.agent.relay import Relay


def main() -> None:
    init.make_undumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the kernel, not for us
    link = HostLink(sys.stdin.fileno(), sys.stdout.fileno())
    relay = Relay(link)
    init.on_terminate(relay.request_termination)
    status = relay.run()
    # Whatever is still queued (the exit frame) goes out, bounded: the host may be gone.
    with contextlib.suppress(OSError):
        link.drain(OUTPUT_DRAIN_TIMEOUT)
    # os._exit, not sys.exit: nothing must run after this (the interpreter's shutdown could
    # stall), and the container ends with us.
    os._exit(status)


if __name__ == "__main__":
    main()
