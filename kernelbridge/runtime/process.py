"""Ending a child process the runtime owns, written once: ask it to go, wait a grace period, then
SIGKILL it and reap it.

The kill goes to the whole process group of a child that started its own session
(``start_new_session``, ``setsid``). Shielded from cancellation (it runs during teardown) and bounded
by ``grace`` up to the kill; the wait after SIGKILL is not bounded (SIGKILL cannot be refused, and an
unreaped child would be a zombie).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc


async def end_process(
    process: anyio.abc.Process,
    *,
    ask: signal.Signals | Callable[[], Awaitable[None]] | None,
    grace: float,
    group: bool = False,
) -> None:
    """End ``process``: ``ask`` it (a signal number, or a coroutine function such as closing its
    stdin; None: kill at once), wait up to ``grace`` seconds, then SIGKILL it (its process group
    when ``group``) and wait for it. Nothing happens to a process that has exited already; the
    caller closes the process's streams (``aclose``) afterwards if it owns them."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None and ask is not None:
            if callable(ask):
                with contextlib.suppress(Exception):  # e.g. its stdin broke: it is going anyway
                    await ask()
            else:
                send_signal(process, ask, group=group)
            with anyio.move_on_after(grace):
                await process.wait()
        if process.returncode is None:
            send_signal(process, signal.SIGKILL, group=group)
            await process.wait()


def send_signal(process: anyio.abc.Process, signum: signal.Signals, *, group: bool = False) -> None:
    """Signal ``process`` (its process group when ``group``); a process already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
