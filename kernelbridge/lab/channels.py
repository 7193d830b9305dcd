"""The lab's kernel websocket (``ServerApp.kernel_websocket_connection_class``): jupyter_server's
own, with kernelbridge's answer for a session that left.

An ``execute_request`` to a kernel whose session is gone (see :mod:`.kernels`) is answered here,
not sent: one stderr line saying why and where its journal is, an error reply, and ``idle``, so
the page's cell ends at once instead of waiting forever. The page's cells still waiting for their
reply when the session leaves are answered the same way (:meth:`SessionChannels.answer_gone`,
called by the kernel manager's refresh).

Who typed a cell: JupyterLab sends no user name in its requests (an empty ``username``), so the
bridge journals the cell as ``source: client`` under its operating system user
(:func:`kernelbridge.jupyter.client_env.real_username`), as it does ``kernelbridge attach``'s.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

V1 = "v1.kernel.websocket.jupyter.org"


class SessionChannels(ZMQChannelsWebsocketConnection):
    """A page's connection to one session's kernel (see the module docstring)."""

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if not self.channels:
            return
        header = self._header(incoming_msg)
        if header is not None and header.get("msg_type") == "execute_request":
            if (gone := self.kernel_manager.gone) is not None:
                self._answer_gone(header, gone)
                return
            self.kernel_manager.wait_for_reply(header, self)
        super().handle_incoming_message(incoming_msg)

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        _, parts = self.session.feed_identities(outgoing_msg)
        if getattr(stream, "channel", None) == "shell" and len(parts) > 2:
            parent = self.session.unpack(parts[2])
            if isinstance(parent, dict):
                self.kernel_manager.replied(parent.get("msg_id"))
        super().handle_outgoing_message(stream, outgoing_msg)

    def _header(self, incoming: Any) -> dict[str, Any] | None:
        """The header of a message from the page (in the protocol it came in), or None."""
        try:
            if self.subprotocol == V1:
                parts = deserialize_msg_from_ws_v1(incoming)[1]
                header = self.session.unpack(parts[0]) if parts else None
            else:
                msg = (
                    deserialize_binary_message(incoming)
                    if isinstance(incoming, bytes)
                    else json.loads(incoming)
                )
                header = msg.get("header") if isinstance(msg, dict) else None
        except (ValueError, IndexError, TypeError):  # jupyter_server's own reading says what is wrong
            return None
        return header if isinstance(header, dict) else None

    def answer_gone(self, request: dict[str, Any], line: str) -> None:
        """End the page's cell ``request`` with ``line`` (its session left meanwhile)."""
        if self.channels:  # still connected
            self._answer_gone(request, line)

    def _answer_gone(self, request: dict[str, Any], line: str) -> None:
        self._to_page("iopub", self.session.msg("status", {"execution_state": "busy"}, parent=request))
        self.write_stderr(line, request)
        reply: dict[str, Any] = {
            "status": "error",
            "ename": "SessionGone",
            "evalue": line,
            "traceback": [],
            "execution_count": None,
        }
        self._to_page("shell", self.session.msg("execute_reply", reply, parent=request))
        self._to_page("iopub", self.session.msg("status", {"execution_state": "idle"}, parent=request))

    def _to_page(self, channel: str, msg: dict[str, Any]) -> None:
        if self.subprotocol == V1:
            self.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack), binary=True)
        else:
            self.write_message(json.dumps({**msg, "channel": channel}, default=str))
