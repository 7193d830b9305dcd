"""Rate-limited logging: one budget for every host log line a sandbox or a client can cause.

A sandbox can send bad frames, log lines or unread output without end, and each would cost a line
in the bridge's log (over stdio, the MCP client's log). :class:`RateLimitedLog` lets at most
``burst`` lines through per ``window`` seconds and counts the rest; the count is said in one line
when the next window opens (or at :meth:`~RateLimitedLog.flush`), so nothing is hidden and the
log stays bounded in rate whatever the sandbox does. Callers clip what they log (:func:`frames.clip`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """At most ``burst`` lines per ``window`` seconds to ``logger``; the rest counted and reported."""

    def __init__(
        self,
        logger: logging.Logger,
        summary: str,
        *,
        burst: int,
        window: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``summary``: the line that reports suppressed lines, with one ``%d`` for their count."""
        self.logger = logger
        self.summary = summary
        self.burst = burst
        self.window = window
        self.clock = clock
        self.suppressed = 0
        """Lines not logged since the last summary."""
        self._window_start = -window - 1.0
        self._in_window = 0

    def log(self, level: int, msg: str, *args: object) -> bool:
        """Log ``msg % args`` if the budget allows; returns whether it was logged."""
        now = self.clock()
        if now - self._window_start > self.window:
            self.flush()
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self.suppressed += 1
            return False
        self._in_window += 1
        self.logger.log(level, msg, *args)
        return True

    def flush(self) -> None:
        """Report the lines suppressed so far (at the end of a sandbox, say), if any."""
        if self.suppressed:
            self.logger.info(self.summary, self.suppressed)
            self.suppressed = 0
