"""A Jupyter client's channels stopped right after they started (:func:`stop_channels`).

jupyter_client's heartbeat thread, stopped before it has begun its loop, begins it anyway and
opens a socket each turn until its context has none left (ZMQError EMFILE, in the thread). On a
busy machine a thread can begin that late: a `make test` run saw it in the kernel conformance
suite, whose iopub welcome test is done a millisecond after it starts a client's channels. Real
threads and a real zmq context; the heartbeat's address is an ipc path that nothing serves (a REQ
socket connects lazily)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.channels import HBChannel

from kernelbridge.jupyter.manager import stop_channels

LATE = 0.2
"""How late each heartbeat thread begins its loop here, as on a machine swamped with work."""


@pytest.fixture
def late_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every heartbeat thread waits :data:`LATE` s before its first socket, i.e. before its loop."""
    create = HBChannel._create_socket
    begun: set[int] = set()

    def late(self: HBChannel) -> None:
        if id(self) not in begun:
            begun.add(id(self))
            threading.Event().wait(LATE)
        create(self)

    monkeypatch.setattr(HBChannel, "_create_socket", late)


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException | None]]:
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    yield errors


def client(tmp_path: Path) -> BlockingKernelClient:
    return BlockingKernelClient(transport="ipc", ip=str(tmp_path / "kernel"), hb_port=1)


def started_client(tmp_path: Path) -> BlockingKernelClient:
    kc = client(tmp_path)
    kc.start_channels(shell=False, iopub=False, stdin=False, hb=True, control=False)
    return kc


def test_channels_stopped_before_the_heartbeat_thread_begins_end_it(
    late_heartbeats: None, thread_errors: list[BaseException | None], tmp_path: Path
) -> None:
    kc = started_client(tmp_path)
    stop_channels(kc)
    assert not kc.hb_channel.is_alive()
    assert thread_errors == []


def test_channels_of_a_client_that_never_started_them_stop(
    thread_errors: list[BaseException | None], tmp_path: Path
) -> None:
    kc = client(tmp_path)
    stop_channels(kc)
    assert not kc.hb_channel.is_alive() and thread_errors == []
