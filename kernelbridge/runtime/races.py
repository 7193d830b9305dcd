"""What an engine says when another of its clients removes a container while it looks, and the
bounded retry of a call that met that.

The backends read these words here and nowhere else. A container another client removed is no
failure of ours: ``remove`` counts it as removed, ``inspect`` as gone (None); a listing that met the
race is asked again by :func:`retrying` (``when=image_vanished`` for an image listing), and so is
an ``inspect`` that met the container's process ending (``when=process_ended``). Why:
docs/design/runtime.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from kernelbridge.errors import RuntimeUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

HALF_REMOVED = "container not known"
"""podman: the container's storage is gone and its record not yet (it is being removed, or a
removal stopped half-way): it is gone for every purpose of ours."""
PROCESS_ENDED = "no such process"
"""podman: the container's process ended while the engine read its cgroup (``read
/proc/<pid>/cgroup: no such process``); asked again, it answers with the container exited."""
VANISHED = (
    HALF_REMOVED,
    "no such container",
    "no container with",
    "does not exist in database",
    PROCESS_ENDED,
)
"""Words of a call that failed because a container (or its process) went while the engine looked."""
IMAGE_VANISHED = "image not known"
"""podman: an image the listing found went (another client removed it) before it was read."""
ATTEMPTS = 6
FIRST_DELAY = 0.1
"""Seconds before the second attempt; each later one waits twice as long (3.1 s in all)."""


def vanished(exc: BaseException) -> bool:
    """Whether ``exc`` says that something the engine was looking at went meanwhile."""
    text = str(exc).lower()
    return any(words in text for words in VANISHED)


def process_ended(exc: BaseException) -> bool:
    """Whether ``exc`` says that the container's process ended while the engine looked at it."""
    return PROCESS_ENDED in str(exc).lower()


def image_vanished(exc: BaseException) -> bool:
    """Whether ``exc`` says that an image the engine was listing went meanwhile."""
    return IMAGE_VANISHED in str(exc).lower()


def half_removed(exc: BaseException) -> bool:
    """Whether ``exc`` is podman's answer about a container whose removal is under way."""
    return HALF_REMOVED in str(exc).lower()


async def retrying(
    call: Callable[[], Awaitable[T]],
    what: str,
    when: Callable[[RuntimeUnavailable], bool] = vanished,
) -> T:
    """``await call()``, asked again (at most :data:`ATTEMPTS` times, backing off) while it fails
    with a RuntimeUnavailable that ``when`` recognises (by default :func:`vanished`: a container
    went); any other failure, or the last one, is raised. ``what`` names the call in the log."""
    delay = FIRST_DELAY
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await call()
        except RuntimeUnavailable as exc:
            if attempt == ATTEMPTS or not when(exc):
                raise
            log.debug("%s met something going away (attempt %d): %s", what, attempt, exc)
        await anyio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # the loop returns or raises
