"""The owner's queue of commands for its tunnel: put without waiting, written in order by one task.

Why a queue: commands are sent from the task that reads the sandbox's events (rpc answers are
sent from there, and the tunnel process answers rpc requests on the spot). If sending waited for
the sandbox's stdin, and the runtime's relay of stdin waited for us to read stdout (conmon does:
it blocks on one direction), neither side would move again. So senders only queue, and
:meth:`CommandQueue.pump` writes. Bounded in number: a sandbox that does not read its stdin gets
its newest commands dropped (counted, the warning rate-limited), never an unbounded queue. Big
answers are few: calls in flight are capped per session.
"""

from __future__ import annotations

import collections
import logging

import anyio

from kernelbridge.ratelimit import RateLimitedLog
from kernelbridge.tunnel import Command, ControlChannel

log = logging.getLogger(__name__)

MAX_COMMANDS = 10_000
"""Commands queued for a sandbox that is not reading its stdin; past this, new ones are dropped
(an rpc flood's refusals, say)."""
DROP_LOG_WINDOW = 60.0
"""One warning per minute about a sandbox whose commands are dropped (each says the count)."""


class CommandQueue:
    """Commands for one tunnel. :meth:`put` from anywhere; run :meth:`pump` in the owner's group."""

    def __init__(self, name: str, limit: int = MAX_COMMANDS) -> None:
        self.name = name
        self.limit = limit
        self.dropped = 0
        self._queue: collections.deque[Command] = collections.deque()
        self._wakeup = anyio.Event()
        self._closed = False
        self._drop_log = RateLimitedLog(
            log, "%d more warnings about dropped commands not logged", burst=1, window=DROP_LOG_WINDOW
        )

    def put(self, command: Command) -> None:
        """Queue ``command``; it never waits. Dropped once the queue is closed (the sandbox
        ended) or full."""
        if self._closed:
            return
        if len(self._queue) >= self.limit:
            self.dropped += 1
            self._drop_log.log(
                logging.WARNING,
                "sandbox %s does not read its stdin: dropped %d command(s), the last a %s",
                self.name, self.dropped, command.TYPE,
            )  # fmt: skip
            return
        self._queue.append(command)
        self._wakeup.set()

    def close(self) -> None:
        """Take no more commands (the sandbox ended)."""
        self._closed = True
        self._queue.clear()
        self._drop_log.flush()

    async def pump(self, channel: ControlChannel) -> None:
        """Owner -> tunnel, in order, as fast as the tunnel takes them, until the channel breaks."""
        while True:
            while self._queue:
                command = self._queue.popleft()
                try:
                    await channel.send(command)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
            self._wakeup = anyio.Event()
            if not self._queue:
                await self._wakeup.wait()
