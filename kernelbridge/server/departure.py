"""The bridge is about to go: its client closed stdin, or a signal came.

Said once, before the transport cancels the requests in flight, so that the registries know it
first: a durable session's running cell is then left running for the next bridge (which is told
how it ended), where a call cancelled while the bridge stays is one its client gave up on, and
its cell is stopped (``session.runner``). Without this, a client that quits mid-cell (no
``notifications/cancelled``, just the end of stdin) would have its cell interrupted on the way out.
"""

from __future__ import annotations

from collections.abc import Callable


class Departure:
    """Announced once by the transport; the lifespan subscribes the registries."""

    def __init__(self) -> None:
        self._hooks: list[Callable[[], None]] = []
        self.announced = False

    def subscribe(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook`` at the announcement (at once if it came already); returns the undo."""
        self._hooks.append(hook)
        if self.announced:
            hook()
        return lambda: self._hooks.remove(hook)

    def announce(self) -> None:
        if self.announced:
            return
        self.announced = True
        for hook in list(self._hooks):
            hook()
