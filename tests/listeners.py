"""A counting listener in a child process, for the tests that prove a sandbox reaches nothing."""

from __future__ import annotations

import subprocess
import sys


class CountingListener:
    """``script`` (run with ``args``, optionally in network namespace ``netns``) listens, prints
    ``listening``, counts what reaches it, and prints ``hits N`` once its stdin closes."""

    def __init__(self, script: str, *args: str, netns: str | None = None) -> None:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "listening"

    def hits(self) -> int:
        """How many connections or datagrams reached it (it ends then)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        line = self.process.stdout.readline().split()
        self.process.wait(10)
        return int(line[1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
