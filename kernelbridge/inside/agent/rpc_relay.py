"""The agent's end of the kernel's host MCP calls (docs/rpc.md): a socketpair per kernel.

The kernel inherits one end (its fd number in ``KERNELBRIDGE_RPC_FD``). Only an ``rpc_request`` line
with an integer id reaches the host, so kernel code cannot inject other frame types; a line over
``frames.MAX_RPC_BYTES`` is dropped and answered ``too_large``. Answers wait in a buffer bounded in
bytes: a kernel that stops reading loses its own answers, it cannot make the agent block or grow.
At most :data:`MAX_WAITING` requests wait for the host (past them ``busy``, a duplicate id
``invalid_params``); when a durable sandbox's host goes, each is answered ``unavailable``
(:meth:`RpcRelay.fail_waiting`), and so is every new one until a host attaches. Methods, params and
grants are the host's business.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Callable

from kernelbridge import frames
from kernelbridge.inside.agent.write_queue import WriteQueue

ENV_VAR = "KERNELBRIDGE_RPC_FD"
READ_CHUNK = 1 << 20
MAX_PENDING_BYTES = 2 * frames.MAX_RPC_BYTES
"""Responses buffered for a kernel that is not reading: two maximal answers."""
MAX_WAITING = 4 * frames.MAX_RPC_IN_FLIGHT
"""Requests sent to the host and not answered yet; past them the relay answers ``busy`` itself
(the host refuses past 64 in flight: the margin is for its refusals on the way back)."""

SendFrame = Callable[[frames.Frame], None]
Log = Callable[[str, str], None]


class RpcRelay:
    """Relays one kernel's rpc socket. The agent polls :attr:`fd` and calls the handlers."""

    def __init__(self, send_frame: SendFrame, log: Log) -> None:
        self._send_frame = send_frame
        self._log = log
        self._agent_end, self._kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._agent_end.setblocking(False)
        self._kernel_end.set_inheritable(True)
        self._decoder = frames.FrameDecoder(max_frame_bytes=frames.MAX_RPC_BYTES)
        self._outgoing = WriteQueue(self._agent_end.send)
        self.closed = False
        self.waiting: dict[int, None] = {}
        """Ids of requests sent to the host and not answered yet, oldest first."""

    @property
    def fd(self) -> int:
        return self._agent_end.fileno()

    @property
    def kernel_fd(self) -> int:
        """The fd the kernel inherits (``pass_fds``); the agent closes its copy once started."""
        return self._kernel_end.fileno()

    def kernel_started(self) -> None:
        """The kernel has its copy of the socket now: drop ours, so that the kernel's exit is
        seen as EOF."""
        self._kernel_end.close()

    @property
    def wants_write(self) -> bool:
        return self._outgoing.pending > 0

    def on_readable(self) -> None:
        try:
            chunk = self._agent_end.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        for item in self._decoder.feed(chunk):
            if isinstance(item, frames.FrameError):
                self._log(f"dropped an rpc line from the kernel: {item.reason}", "warning")
                if (request_id := _oversized_request_id(item)) is not None:
                    message = (
                        f"the request is {item.size:,} bytes, over the {frames.MAX_RPC_BYTES:,}"
                        " byte limit of a host MCP call"
                    )
                    self._refuse(request_id, "too_large", message)
            elif item["type"] != frames.RPC_REQUEST or not _valid_id(item.get("id")):
                self._log(f"dropped a {frames.clip(item['type'], 40)} line on the rpc socket", "warning")
            elif item["id"] in self.waiting:
                self._refuse(item["id"], "invalid_params", f"request id {item['id']} is in flight")
            elif len(self.waiting) >= MAX_WAITING:
                self._refuse(
                    item["id"],
                    "busy",
                    f"{MAX_WAITING} host calls are already waiting for the host; await some first",
                )
            else:
                self.waiting[item["id"]] = None
                self._send_frame(
                    {
                        "type": frames.RPC_REQUEST,
                        "id": item["id"],
                        "method": item.get("method"),
                        "params": item.get("params"),
                        "cell": item.get("cell"),
                    }
                )

    def deliver(self, frame: frames.Frame) -> None:
        """Queue a host ``rpc_response`` for the kernel (flushed by :meth:`on_writable`)."""
        if isinstance(answered := frame.get("id"), int):
            self.waiting.pop(answered, None)
        self._to_kernel(frame)

    def _to_kernel(self, frame: frames.Frame) -> None:
        if self.closed:
            return
        try:
            data = frames.encode(frame)
        except (TypeError, ValueError) as exc:
            self._log(f"dropped an rpc response: {exc}", "warning")
            return
        if self._outgoing.pending + len(data) > MAX_PENDING_BYTES:
            self._log("the kernel is not reading its rpc answers; dropped one", "warning")
            return
        self._outgoing.append(data)
        self.on_writable()

    def answer_unavailable(self, request_id: int, message: str) -> None:
        """Answer one request ``unavailable`` (no host can answer it)."""
        error = {"kind": "unavailable", "message": message}
        self.deliver({"type": frames.RPC_RESPONSE, "id": request_id, "error": error})

    def _refuse(self, request_id: int, kind: str, message: str) -> None:
        """Answer a request the host never sees (a request with its id waiting stays waiting)."""
        error = {"kind": kind, "message": message}
        self._to_kernel({"type": frames.RPC_RESPONSE, "id": request_id, "error": error})

    def fail_waiting(self, message: str) -> int:
        """Answer every request still waiting for the host ``unavailable`` (it has gone); returns
        how many."""
        ids = list(self.waiting)
        for request_id in ids:
            self.answer_unavailable(request_id, message)
        return len(ids)

    def on_writable(self) -> None:
        try:
            self._outgoing.flush()
        except OSError:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._outgoing.clear()
        with contextlib.suppress(OSError):
            self._agent_end.close()
        with contextlib.suppress(OSError):
            self._kernel_end.close()


_ID = re.compile(rb'^\{"type":"rpc_request","id":(\d{1,15})[,}]')


def _oversized_request_id(error: frames.FrameError) -> int | None:
    """The id of the request an oversized line was, read from its first bytes (the kernel side
    writes ``type`` and ``id`` first), so that it can be answered ``too_large``."""
    match = _ID.match(error.head)
    if match is None:
        return None
    request_id = int(match.group(1))
    return request_id if _valid_id(request_id) else None


def _valid_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**53


def kernel_env(relay: RpcRelay) -> dict[str, str]:
    """What the kernel's environment needs to find its rpc socket."""
    return {ENV_VAR: str(relay.kernel_fd)}
