"""The agent's kernel start on the host's ports, as the local test double runs it (a container has
ports of its own): a port taken between the agent choosing it and the kernel binding it costs a
second start, not the sandbox, whether the kernel exits or is left alive by it. A real ipykernel,
started by the agent's relay in this process."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbridge import frames
from kernelbridge.inside.agent import relay as relay_module
from kernelbridge.inside.agent.host_link import HostLink
from kernelbridge.inside.agent.kernel_process import ports_taken
from kernelbridge.inside.agent.relay import Relay
from kernelbridge.inside.agent.state import Phase


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port of 127.0.0.1 that another process's socket holds."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def relay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Relay, int]]:
    """A relay whose host is a pair of pipes (the test reads the host's end), its kernel's files
    under ``tmp_path``."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    agent_in, host_out = os.pipe()
    host_in, agent_out = os.pipe()
    os.set_blocking(host_in, False)
    relay = Relay(HostLink(agent_in, agent_out))
    relay._key = b"a-key-for-this-test"  # what the host's hello would say (Relay.run takes it)
    try:
        yield relay, host_in
    finally:
        if relay._kernel is not None:  # its process and sockets: a zmq context ends after them
            relay._drop(relay._kernel)
        relay._context.term()
        for fd in (agent_in, host_out, host_in, agent_out):
            os.close(fd)


def test_a_held_port_is_taken_and_a_free_one_is_not(held_port: int) -> None:
    connection = {"ip": "127.0.0.1", "shell_port": held_port, "iopub_port": 0, "stdin_port": 0}
    assert ports_taken({**connection, "control_port": 0, "hb_port": 0})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert not ports_taken({**connection, "shell_port": free, "control_port": 0, "hb_port": 0})


def test_a_port_taken_before_the_kernel_binds_it_gets_a_second_start(
    relay: tuple[Relay, int], held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, host_in = relay
    chosen = _first_port_taken(monkeypatch, "shell_port", held_port)  # the kernel exits at once
    assert agent._boot() is None
    assert agent.phase is Phase.RELAYING
    assert [info["shell_port"] == held_port for info in chosen] == [True, False]
    said, warnings = _said(host_in)
    assert any("one of its ports was taken meanwhile" in w for w in warnings), said
    assert said[-1]["type"] == frames.READY


def test_a_kernel_left_alive_by_a_taken_iopub_port_is_stopped_and_started_again(
    relay: tuple[Relay, int], held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ipykernel that cannot bind its iopub port does not exit (it hangs in its ZMQ context's
    term): it never answers, so the ready wait's deadline ends it, and the start goes again on
    other ports. The deadline is shortened here (60 s in the agent)."""
    agent, host_in = relay
    chosen = _first_port_taken(monkeypatch, "iopub_port", held_port)
    wait = relay_module.KernelClient.wait_until_iopub_delivers

    def first_wait_short(client: Any, alive: Any) -> dict[str, Any] | None:
        # The first kernel never answers; the second has the agent's own bound, load or not.
        return wait(client, alive, timeout=4.0) if len(chosen) == 1 else wait(client, alive)

    monkeypatch.setattr(relay_module.KernelClient, "wait_until_iopub_delivers", first_wait_short)
    assert agent._boot() is None
    assert agent.phase is Phase.RELAYING
    assert [info["iopub_port"] == held_port for info in chosen] == [True, False]
    said, warnings = _said(host_in)
    assert any("kernel did not answer within" in w and "taken meanwhile" in w for w in warnings), said
    assert said[-1]["type"] == frames.READY


def _first_port_taken(monkeypatch: pytest.MonkeyPatch, port: str, held_port: int) -> list[dict[str, Any]]:
    """The agent's first connection file names ``held_port`` as its ``port`` (another process took
    it before the kernel bound it); later ones are left as chosen. Returns every connection, as
    the agent chooses them."""
    chosen: list[dict[str, Any]] = []
    write_connection_file = relay_module.write_connection_file

    def first_one_taken(key: bytes) -> dict[str, Any]:
        info = write_connection_file(key)
        if not chosen:
            info[port] = held_port
            Path(info["path"]).write_text(json.dumps({k: v for k, v in info.items() if k != "path"}))
        chosen.append(info)
        return info

    monkeypatch.setattr(relay_module, "write_connection_file", first_one_taken)
    return chosen


def _said(host_in: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The frames the agent wrote to the host so far, and its warning lines among them."""
    said = [f for f in frames.FrameDecoder().feed(os.read(host_in, 1 << 20)) if isinstance(f, dict)]
    warnings = [f["message"] for f in said if f["type"] == frames.LOG and f.get("level") == "warning"]
    return said, warnings
