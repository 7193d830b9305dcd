"""The agent's non-blocking write queue over a real socketpair with a small buffer: what the socket
does not take stays queued, in order; a vanished reader raises to the owner."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from kernelbridge.inside.agent.write_queue import WriteQueue


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    writer.setblocking(False)
    yield writer, reader
    writer.close()
    reader.close()


def test_what_the_socket_does_not_take_stays_queued_in_order(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    writer, reader = pair
    queue = WriteQueue(writer.send)
    pieces = [bytes([n]) * 300_000 for n in range(3)]
    for piece in pieces:
        queue.append(piece)
    assert queue.pending == 900_000
    received = bytearray()
    while queue.pending:
        queue.flush()  # never blocks: takes what the buffer holds
        assert queue.pending == 900_000 - len(received) - _available(reader)
        received += reader.recv(1 << 20)
    queue.flush()
    while len(received) < 900_000:
        received += reader.recv(1 << 20)
    assert bytes(received) == b"".join(pieces)
    assert "0 bytes" in repr(queue)


def test_a_reader_that_is_gone_raises_and_clear_forgets(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, reader = pair
    queue = WriteQueue(writer.send)
    reader.close()
    queue.append(b"for nobody")
    with pytest.raises(BrokenPipeError):
        queue.flush()
    assert queue.pending == len(b"for nobody")  # not written, still there
    queue.clear()
    assert queue.pending == 0
    queue.flush()  # nothing to write: nothing raised


def _available(reader: socket.socket) -> int:
    """Bytes waiting in ``reader`` (written but not received yet)."""
    reader.setblocking(False)
    try:
        return len(reader.recv(1 << 22, socket.MSG_PEEK))
    except BlockingIOError:
        return 0
    finally:
        reader.setblocking(True)
