"""``exit_task_group``: a cancellation handed to a task group's exit from an ``AsyncExitStack``
goes on with a finite context chain. Forwarded plainly, anyio raises it again and contextlib makes
it its own ``__context__``; anyio's task-done callback then walks that chain forever (a bridge
stopped by SIGTERM spun at full speed: ``kernelbridge/taskgroups.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from types import TracebackType

import anyio
import anyio.abc
import pytest

from kernelbridge.taskgroups import exit_task_group

pytestmark = pytest.mark.anyio

Exit = Callable[
    [anyio.abc.TaskGroup, type[BaseException] | None, BaseException | None, TracebackType | None],
    Awaitable[bool | None],
]


async def plain(
    tg: anyio.abc.TaskGroup,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool | None:
    return await tg.__aexit__(exc_type, exc, tb)


class Holder:
    """A part that holds a task group, as the host-server pool and the bridge's start do."""

    def __init__(self, leave: Exit) -> None:
        self.leave = leave
        self.tg = anyio.create_task_group()

    async def __aenter__(self) -> Holder:
        await self.tg.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self.leave(self.tg, exc_type, exc, tb)


def context_chain_is_finite(exc: BaseException) -> bool:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None:
        if id(link) in seen:
            return False
        seen.add(id(link))
        link = link.__context__
    return True


async def cancellation_through_a_stack(leave: Exit) -> BaseException:
    """The bridge's shutdown in small: its lifespan's stack unwinds an error, a later part is
    cancelled while closing, and the part holding a task group is handed that cancellation."""
    with anyio.CancelScope() as scope:
        try:
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(Holder(leave))
                stack.push_async_callback(anyio.sleep, 0)  # a checkpoint: raises the cancellation
                scope.cancel()
                raise LookupError("the error the stack unwinds")
        except BaseException as exc:
            return exc
    raise AssertionError("the cancellation did not come through the stack")


async def test_a_task_group_left_through_an_exit_stack_keeps_the_cancellation_chain_finite() -> None:
    raised = await cancellation_through_a_stack(exit_task_group)
    assert isinstance(raised, anyio.get_cancelled_exc_class())
    assert context_chain_is_finite(raised)
    assert isinstance(raised.__context__, LookupError), "the unwound error stays its context"


async def test_forwarded_plainly_the_same_cancellation_becomes_its_own_context() -> None:
    """The defect the helper exists for, pinned: if anyio or contextlib change so that this no
    longer happens, the helper (and this test) can go."""
    raised = await cancellation_through_a_stack(plain)
    assert raised.__context__ is raised


async def test_an_error_other_than_the_one_handed_in_still_comes_out() -> None:
    async def fails() -> None:
        raise KeyError("a child's failure")

    tg = anyio.create_task_group()
    await tg.__aenter__()
    tg.start_soon(fails)
    with pytest.raises(BaseExceptionGroup) as info:
        await exit_task_group(tg, None, None, None)
    assert info.group_contains(KeyError)


async def test_a_clean_exit_returns_false() -> None:
    tg = anyio.create_task_group()
    await tg.__aenter__()
    assert await exit_task_group(tg, None, None, None) is False
