"""The sandbox kernel's stdout/stderr (``CappedOutStream``) waits in ``flush`` for what was
written to be sent, as ipykernel's does, and does not wait for its IOPub thread when everything
written is sent already (a cell's end flushes six times, most often with nothing written).

A real ipykernel IOPub thread and PUB socket in this process; the thread is held busy by a
callable that waits for the test, so "waits" and "does not wait" are told apart by what happened
first, not by how long anything took."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.session import Session

from kernelbridge.inside.kernel.capped_outstream import CappedOutStream

BOUND = 30.0
"""Seconds any step may take before the test fails: far above what the right behaviour takes."""


class Recorded(CappedOutStream):
    """The stream, noting when a send of its buffers finished."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []

    def _flush(self) -> None:
        super()._flush()
        self.events.append("sent")


@dataclass
class Pub:
    thread: IOPubThread
    stream: Recorded

    def hold(self) -> threading.Event:
        """Keep the IOPub thread busy until the returned event is set."""
        release, holding = threading.Event(), threading.Event()

        def busy() -> None:
            holding.set()
            release.wait(BOUND * 2)

        self.thread.schedule(busy)
        assert holding.wait(BOUND), "the IOPub thread never ran the holder"
        return release


@pytest.fixture
def pub() -> Iterator[Pub]:
    context = zmq.Context()
    socket = context.socket(zmq.PUB)
    socket.bind("inproc://iopub")
    thread = IOPubThread(socket)
    thread.start()
    stream = Recorded(Session(key=b""), thread, "stdout", watchfd=False)
    # ipykernel's flush gives up waiting after flush_timeout (10 s) and prints a warning: make a
    # wait that should not happen outlast the test's bound instead.
    stream.flush_timeout = BOUND * 4
    try:
        yield Pub(thread, stream)
    finally:
        stream.close()
        # Not IOPubThread.stop(): it cancels the thread's gc task without letting the loop run the
        # cancellation, and asyncio says "Task was destroyed but it is pending!" at exit. With its
        # loop stopped, the thread cancels the task itself (its atexit stop() then finds it ended).
        thread.io_loop.add_callback(thread.io_loop.stop)
        thread.thread.join(BOUND)
        context.destroy(linger=0)  # the PUB socket and the event pipes the thread left open


def in_thread(call: Callable[[], None], events: list[str]) -> threading.Event:
    """Run ``call`` in a thread of its own; note "returned" when it has."""
    done = threading.Event()

    def run() -> None:
        call()
        events.append("returned")
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_flush_with_nothing_written_does_not_wait_for_the_iopub_thread(pub: Pub) -> None:
    release = pub.hold()
    try:
        done = in_thread(pub.stream.flush, pub.stream.events)
        assert done.wait(BOUND), "flush waited for a busy IOPub thread with nothing to send"
    finally:
        release.set()


def test_a_flush_after_a_write_returns_once_the_write_is_sent(pub: Pub) -> None:
    release = pub.hold()
    pub.stream.write("hello\n")
    queued_before = len(pub.thread._events)  # the write's own flush timer, queued behind the holder
    done = in_thread(pub.stream.flush, pub.stream.events)
    # The flush hands its send and its wake-up to the busy thread; until that thread runs them, it
    # must not return. Released once both are queued (or, wrongly, once it returned).
    for _ in range(int(BOUND / 0.01)):
        if done.is_set() or len(pub.thread._events) >= queued_before + 2:
            break
        time.sleep(0.01)
    release.set()
    assert done.wait(BOUND), "flush never returned"
    assert pub.stream.events[:2] == ["sent", "returned"], pub.stream.events


def test_once_sent_a_later_flush_does_not_wait(pub: Pub) -> None:
    pub.stream.write("hello\n")
    assert in_thread(pub.stream.flush, pub.stream.events).wait(BOUND)
    assert pub.stream.events[:2] == ["sent", "returned"], pub.stream.events
    release = pub.hold()
    try:
        assert in_thread(pub.stream.flush, pub.stream.events).wait(BOUND), "flush waited with nothing unsent"
    finally:
        release.set()
