"""Leaving an anyio task group from another object's ``__aexit__``.

anyio's ``TaskGroup.__aexit__`` raises a cancellation it was handed again, the same object. Under
an ``AsyncExitStack`` (the bridge's lifespan holds its parts in one), contextlib then makes that
exception its own ``__context__``, and anyio's task-done callback, which walks a cancellation's
context chain, loops on it forever: a bridge told to stop spun at full speed instead (found by
SIGTERM to a client, its bridge and host servers together; ``tests/unit/test_taskgroups.py``)::

    async def __aexit__(self, exc_type, exc, tb):
        return await exit_task_group(self._tg, exc_type, exc, tb)
"""

from __future__ import annotations

from types import TracebackType

from anyio.abc import TaskGroup


async def exit_task_group(
    tg: TaskGroup, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
) -> bool:
    """``tg.__aexit__(exc_type, exc, tb)``, except that ``exc`` raised again comes back as
    ``False`` (the caller's context manager lets it go on, as the protocol means it to)."""
    try:
        return bool(await tg.__aexit__(exc_type, exc, tb))
    except BaseException as raised:
        if exc is not None and raised is exc:
            return False
        raise
