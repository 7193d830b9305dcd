"""Attacks on the bridge's memory from inside a sandbox, each measured: the peak resident size of
the bridge process (VmHWM, reset before each attack) must stay within the bound computed from
the caps (README, "What the sandbox guarantees"), and nothing may stay held afterwards.

Each test prints its measurement (``pytest -s``) for the README's table."""

from __future__ import annotations

import pytest
from bridge_harness import Bridge, reset_peak

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

MiB = 1024  # KiB per MiB: /proc figures are in KiB
PER_SESSION_BOUND = 560 * MiB
"""The computed worst case of one hostile session (README); every measured peak must be below."""
RETAINED = 200 * MiB
"""What may stay held after an attack (caches, allocator slack), over the RSS before it."""


async def measured(bridge: Bridge, code: str, session: str, timeout: int = 120) -> tuple[str, int, int]:
    """Run one attack cell; return (status, peak growth KiB, retained growth KiB)."""
    await bridge.run("1", session)
    before = bridge.rss_kib()
    reset_peak(bridge.pid)
    result = await bridge.run(code, session, timeout=timeout)
    peak = bridge.peak_kib() - before
    await bridge.run("1", "mem-bystander")  # the bridge serves others afterwards
    retained = bridge.rss_kib() - before
    print(f"\n{session}: status {result.status}, peak +{peak // MiB} MiB, retained +{retained // MiB} MiB")
    assert peak < PER_SESSION_BOUND, (session, peak)
    assert retained < RETAINED, (session, retained)
    return str(result.status), peak, retained


# Each attack sends what fits the sandbox's 512 MiB when it all queues there at once (in the
# kernel's and the agent's queues, while the bridge reads the first frames): six 30 MiB displays,
# not twenty; forty 4 MiB images, not two hundred. Bigger, the kernel dies of it before the bridge
# sees much (`kernel_died`, the bridge unharmed: the sandbox's limit is the first cap) and the
# attack tests nothing of the bridge, so each test checks that the kernel lived.


async def test_displays_with_huge_metadata(bridge: Bridge) -> None:
    code = r"""
from IPython.display import display
meta = {"big": "m" * (30 << 20)}
for i in range(6):
    display({"text/plain": f"d{i}"}, raw=True, metadata=meta)
"""
    status, _, _ = await measured(bridge, code, "mem-metadata")
    assert status == "ok", status
    notebook = await bridge.notebook("mem-metadata")
    assert "metadata of" in notebook and len(notebook) < 2_000_000


async def test_displays_with_huge_json_data(bridge: Bridge) -> None:
    code = r"""
from IPython.display import display
for i in range(6):
    display({"text/plain": "j", "application/json": {"k": ["j" * (1 << 20)] * 30}}, raw=True)
"""
    status, _, _ = await measured(bridge, code, "mem-json")
    assert status == "ok", status


async def test_forged_cells_of_other_clients_full_of_images(bridge: Bridge) -> None:
    # Any code can publish "status: busy" for a parent it invents: each such cell is another
    # client's cell to the recorder, which may hold its outputs until it ends (never, here).
    code = r"""
import uuid
k = get_ipython().kernel
png = "A" * (4 << 20)
for _ in range(40):
    parent = {"header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "session": "x"}}
    k.session.send(k.iopub_socket, "status", {"execution_state": "busy"}, parent=parent)
    k.session.send(k.iopub_socket, "display_data", {"data": {"image/png": png}, "metadata": {}},
                   parent=parent)
"""
    status, _, _ = await measured(bridge, code, "mem-forged-cells")
    assert status == "ok", status
    later = await bridge.run("1", "mem-forged-cells")
    assert later.codes == ["background_output"], later.text  # what the bridge made of the 40 images


async def test_a_huge_exception_completes_with_a_capped_error(bridge: Bridge) -> None:
    status, _, _ = await measured(bridge, "raise ValueError('e' * (30 << 20))", "mem-exception", timeout=60)
    assert status == "error"  # not a timeout: the agent clips a message over the frame cap
    result = await bridge.run("raise ValueError('f' * (5 << 20))", "mem-exception")
    assert result.status == "error" and len(result.data["error"]["evalue"]) < 30_000


async def test_a_display_of_millions_of_tiny_values(bridge: Bridge) -> None:
    # 1.4 million empty lists in 4 MiB of JSON: parsed, they would cost the bridge ~100 MB and
    # a second of CPU; the frame decoder counts them before parsing and drops the frame.
    code = r"""
from IPython.display import display
display({"text/plain": "v", "application/json": {"v": [[] for _ in range(1_400_000)]}}, raw=True)
print("sent")
"""
    status, _, _ = await measured(bridge, code, "mem-tiny-values")
    assert status == "ok"
