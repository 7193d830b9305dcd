"""The recorder with scripted iopub messages and the tunnel's record of clients' execute requests:
a cell is another client's only when a client really sent its request (issue 13)."""

from __future__ import annotations

from typing import Any

import pytest

from kernelbridge.session.cell import CellClient
from kernelbridge.session.recorder import Recorder
from kernelbridge.tunnel import ClientExecute, Tunnel
from kernelbridge.tunnel.core import MAX_CLIENT_CODE_CHARS, MAX_CLIENT_EXECUTES

pytestmark = pytest.mark.anyio


def iopub(parent_id: str, msg_type: str, content: dict[str, Any], **parent: Any) -> dict[str, Any]:
    header = {"msg_id": f"{parent_id}-{msg_type}", "msg_type": msg_type}
    parent_header = {"msg_id": parent_id, "msg_type": "execute_request", **parent}
    return {"header": header, "parent_header": parent_header, "content": content}


def a_cell(parent_id: str, code: str, png: str = "A" * 100, **parent: Any) -> list[dict[str, Any]]:
    return [
        iopub(parent_id, "status", {"execution_state": "busy"}, **parent),
        iopub(parent_id, "execute_input", {"code": code, "execution_count": 7}, **parent),
        iopub(parent_id, "display_data", {"data": {"image/png": png}, "metadata": {}}, **parent),
        iopub(parent_id, "stream", {"name": "stdout", "text": "hi\n"}, **parent),
        iopub(parent_id, "status", {"execution_state": "idle"}, **parent),
    ]


class Record:
    def __init__(self) -> None:
        self.journalled: list[Any] = []
        self.sent: dict[str, ClientExecute] = {}
        self.running: list[tuple[str, bool]] = []

    async def journal(self, cell: Any) -> None:
        self.journalled.append(cell)

    def client_execute(self, msg_id: str) -> ClientExecute | None:
        return self.sent.pop(msg_id, None)

    def observe(self, msg_id: str, running: bool) -> None:
        self.running.append((msg_id, running))


async def test_cells_under_parents_nobody_sent_are_not_cells() -> None:
    record = Record()
    recorder = Recorder(2000, on_client_cell=record.journal, client_execute=record.client_execute)
    for n in range(40):
        for msg in a_cell(f"forged-{n}", "import time; time.sleep(20)", username="a person"):
            await recorder.on_iopub(msg)
    assert (
        record.journalled == [] and not recorder.cells and recorder.unsent == 80
    )  # busy + execute_input each
    note = recorder.take_background()
    assert note is not None and note.displays == 40 and note.text.count("hi") == 40
    assert recorder.take_background() is None  # reported once


async def test_a_real_clients_cell_keeps_what_the_client_sent() -> None:
    record = Record()
    recorder = Recorder(
        2000, on_client_cell=record.journal, client_execute=record.client_execute, on_running=record.observe
    )
    record.sent["real"] = ClientExecute("person", "console-1", "print('hi')")
    # Kernel code forges the cell's execute_input (other code, another user) before the real one.
    await recorder.on_iopub(iopub("real", "status", {"execution_state": "busy"}, username="mallory"))
    await recorder.on_iopub(iopub("real", "execute_input", {"code": "time.sleep(20)"}, username="mallory"))
    for msg in a_cell("real", "print('hi')")[1:]:
        await recorder.on_iopub(msg)
    (cell,) = record.journalled
    assert cell.code == "print('hi')" and cell.client == CellClient("person", "console-1")
    assert record.running == [("real", True), ("real", False)]
    # The request is taken once: a second "busy" for the same parent is no second cell.
    for msg in a_cell("real", "again"):
        await recorder.on_iopub(msg)
    assert len(record.journalled) == 1


async def test_the_bridges_own_cells_are_reported_running() -> None:
    record = Record()
    recorder = Recorder(2000, on_running=record.observe)
    cell = recorder.expect("ours", "1 + 1")
    recorder.forget(cell)
    recorder.forget(cell)
    assert record.running == [("ours", True), ("ours", False)]


class _Stream:
    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise AssertionError("not read")


def request(msg_id: str, code: str = "1", **content: Any) -> dict[str, Any]:
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "person", "session": "s" * 100}
    return {"header": header, "parent_header": {}, "content": {"code": code, "silent": False, **content}}


def test_the_tunnel_remembers_clients_execute_requests_bounded() -> None:
    tunnel = Tunnel(_Stream(), None, connection=None, session="t", kernel_key="k")  # type: ignore[arg-type]
    tunnel.note_client_execute("a", request("a", "print(1)"))
    tunnel.note_client_execute("quiet", request("quiet", silent=True))
    sent = tunnel.take_client_execute("a")
    assert sent == ClientExecute("person", "s" * 64, "print(1)")
    assert tunnel.take_client_execute("a") is None and tunnel.take_client_execute("quiet") is None
    for n in range(3 * MAX_CLIENT_EXECUTES):
        tunnel.note_client_execute(str(n), request(str(n), "x" * MAX_CLIENT_CODE_CHARS * 2))
    assert len(tunnel.client_executes) <= 4
    assert sum(len(c.code) for c in tunnel.client_executes.values()) <= 4 * MAX_CLIENT_CODE_CHARS
    for n in range(3 * MAX_CLIENT_EXECUTES):
        tunnel.note_client_execute(f"small-{n}", request(f"small-{n}"))
    assert len(tunnel.client_executes) == MAX_CLIENT_EXECUTES
