"""Issue 13's attacks by one HTTP token on another, and by a sandbox on the record, through a real
``kernelbridge serve --http`` with two tokens (alice and bob, each a hostile tenant with hostile
code in her sandboxes), real MCP clients over streamable HTTP, real podman sandboxes and a real
host MCP server (tests/peers/edge_server.py).

Each test prints what it measured (``pytest -s``) for the README's "What the sandbox guarantees".
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from bridge_harness import KERNELBRIDGE, REPO, Bridge, Result, open_http_bridge, reset_peak
from nbformat import v4
from peers.hostile_cells import BIG_CELL, flood
from waiting import hang_guard

from kernelbridge.session.store import SessionStore

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

EDGE = REPO / "tests" / "peers" / "edge_server.py"
TOKENS = {"alice": "alice-0123456789abcdef-secret", "bob": "bob-fedcba9876543210-secret"}
MiB = 1024  # KiB per MiB: /proc figures are in KiB
PER_SESSION_BOUND = 560 * MiB


@pytest.fixture(scope="module")
async def tenants(
    tmp_path_factory: pytest.TempPathFactory, sandbox_image: str
) -> AsyncIterator[dict[str, Bridge]]:
    root = tmp_path_factory.mktemp("tenants")
    config = root / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"edge": {"command": sys.executable, "args": [str(EDGE)]}}}))
    env = {
        "KERNELBRIDGE_SERVERS_CONFIG": str(config),
        "KERNELBRIDGE_MAX_SESSIONS": "8",
        "KERNELBRIDGE_HTTP_MAX_SESSIONS": "4",
        "KERNELBRIDGE_HTTP_DISK_QUOTA": "256m",
    }
    async with open_http_bridge(root / "state", TOKENS, **env) as opened:
        yield opened


async def file_of(tenant: Bridge, session: str, path: str, timeout: float = 60) -> str:
    """A file of the session's /workspace once it exists, read as a resource: no cell runs."""
    with anyio.fail_after(timeout):
        while True:
            try:
                found = await tenant.client.read_resource(f"kernelbridge://sessions/{session}/files/{path}")
            except Exception:
                found = None
            if found is not None and found.contents:
                return str(found.contents[0].text)
            await anyio.sleep(0.25)


def journal_of(tenant: Bridge, session: str) -> Path:
    return SessionStore(tenant.state_dir).journal(session)


# -- 1. saved tools --------------------------------------------------------------------------------
SAVE = '''
def report():
    """Whose code is this?"""
    return "ALICE'S CODE RAN HERE"
print(save_tool(report))
'''
PROBE_SKILLS = """
verdict = {"listed": [s["name"] for s in runtime.list_skills()]}
try:
    from mcp.skills import report
    verdict["imported"] = report()
except Exception as exc:
    verdict["imported"] = [type(exc).__name__, getattr(exc, "kind", None)]
"""


async def test_one_tokens_saved_tools_are_invisible_to_another(tenants: dict[str, Bridge]) -> None:
    alice, bob = tenants["alice"], tenants["bob"]
    saved = await alice.run(SAVE, "skills")
    assert saved.status == "ok" and "saved tool 'report'" in saved.stdout, saved.text
    seen_by_bob = await bob.probe(PROBE_SKILLS, "skills")
    assert seen_by_bob == {"listed": [], "imported": ["ModuleNotFoundError", None]}, seen_by_bob
    # Bob's tool of the same name is his own: Alice's is not replaced.
    mine = await bob.run(SAVE.replace("ALICE", "BOB"), "skills")
    assert "saved tool 'report'" in mine.stdout and "replaced" not in mine.stdout, mine.text
    assert (await alice.probe(PROBE_SKILLS, "skills-2"))["imported"] == "ALICE'S CODE RAN HERE"
    assert (await bob.probe(PROBE_SKILLS, "skills-2"))["imported"] == "BOB'S CODE RAN HERE"
    # The operator sees both, by namespace.
    operator = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(alice.state_dir.parents[1])}
    listed = await anyio.run_process([str(KERNELBRIDGE), "skills", "list", "--json"], env=operator)
    assert [i["name"] for i in json.loads(listed.stdout)] == ["alice/report", "bob/report"]
    for tenant in (alice, bob):
        for session in ("skills", "skills-2"):
            await tenant.close(session)
    print("\nsaved tools: alice's report() invisible to bob (listed [], ModuleNotFoundError); both kept")


# -- 2. host call slots ----------------------------------------------------------------------------
HOLD_SLOTS = """
import asyncio
held = [asyncio.ensure_future(runtime.call_tool("edge", "slow", {"seconds": 120})) for _ in range(64)]
await asyncio.sleep(2)
extra = await asyncio.gather(runtime.call_tool("edge", "echo", {"text": "65th"}), return_exceptions=True)
print(sum(not c.done() for c in held), type(extra[0]).__name__)
"""
FORGED_LATER = """
import json, threading, time
import mcp._transport as transport
def later():
    time.sleep(3)  # the cell has ended by then, and nothing else runs in this session
    try:
        params = {"server": "edge", "tool": "slow", "arguments": {"seconds": 120}}
        transport.connect().call("call_tool", params, "a-cell-nobody-runs")
        out = ["accepted"]
    except Exception as exc:
        out = [type(exc).__name__, getattr(exc, "kind", None), str(exc)]
    open("/workspace/late.json", "w").write(json.dumps(out))
threading.Thread(target=later, daemon=True).start()
"""
BYSTANDER = """
import asyncio, time
start = time.monotonic()
answers = await asyncio.gather(*(runtime.call_tool("edge", "echo", {"text": str(i)}) for i in range(20)),
                               return_exceptions=True)
verdict = {"ok": sum(isinstance(a, dict) and not a["isError"] for a in answers),
           "errors": sorted({type(a).__name__ for a in answers if not isinstance(a, dict)}),
           "seconds": time.monotonic() - start}
"""


async def test_one_token_cannot_fill_anothers_host_call_slots(tenants: dict[str, Bridge]) -> None:
    alice, bob = tenants["alice"], tenants["bob"]
    held = await alice.run(HOLD_SLOTS, "default", servers=["edge"])
    assert held.status == "ok" and held.stdout.split() == ["64", "McpBusy"], held.text  # her own cap
    # Bob's own "default", same name: his calls have slots of their own (calls queued behind hers
    # would wait out her 120 s calls, past the hang guard).
    with hang_guard(60, "bob's 20 calls while alice holds 64"):
        verdict = await bob.probe(BYSTANDER, "default", servers=["edge"])
    assert verdict["ok"] == 20 and verdict["errors"] == [], verdict
    # A call claiming a cell nobody runs, sent while no cell runs: refused at once.
    assert (await alice.run(FORGED_LATER, "default")).status == "ok"
    late = json.loads(await file_of(alice, "default", "late.json"))
    assert late[:2] == ["McpCancelled", "cancelled"] and "no cell is running" in late[2], late
    await alice.close("default")  # her 64 calls are cancelled with her session
    assert (await bob.probe(BYSTANDER, "default"))["ok"] == 20
    await bob.close("default")
    print(f"\nslots: alice holds 64 calls; bob's 20 calls all answered in {verdict['seconds']:.2f} s; "
          f"alice's forged late call: {late[0]}")  # fmt: skip


# -- 3. the record ---------------------------------------------------------------------------------


async def test_forged_cells_are_not_recorded_and_cannot_grow_the_journal(tenants: dict[str, Bridge]) -> None:
    alice = tenants["alice"]
    await alice.run("x = 1", "flood")
    before = journal_of(alice, "flood").stat().st_size
    reset_peak(alice.pid)
    rss = alice.rss_kib()
    began = time.monotonic()
    assert (await alice.run(flood(), "flood")).status == "ok"
    forged = int(await file_of(alice, "flood", "flood.done"))
    after_flood = await alice.run("x", "flood")  # after every forged message (iopub is in order)
    seconds = time.monotonic() - began
    peak = alice.peak_kib() - rss
    grown = journal_of(alice, "flood").stat().st_size - before
    entries = [json.loads(line) for line in journal_of(alice, "flood").read_text().splitlines()]
    assert [e.get("source") for e in entries if e["type"] == "cell"] == ["mcp", "mcp", "mcp"]
    assert grown < 64 * 1024, grown  # the two real cells' lines, nothing of the forgeries
    assert "background_output" in after_flood.codes, after_flood.text  # the forgeries: output, no cells
    assert peak < PER_SESSION_BOUND, peak
    notebook = await alice.client.read_resource("kernelbridge://sessions/flood/notebook")
    nb = nbformat.reads(notebook.contents[0].text, as_version=4)
    assert [c.metadata["kernelbridge"]["source"] for c in nb.cells] == ["mcp", "mcp", "mcp"]
    await alice.close("flood")
    print(f"\nforged cells: {forged} forged cells of ~17 MiB in {seconds:.1f} s; "
          f"journal +{grown / 1024:.1f} KiB (the 2 real cells); bridge peak +{peak // MiB} MiB")  # fmt: skip


async def test_exporting_a_big_journal_is_bounded_and_never_stalls_another_token(
    tenants: dict[str, Bridge],
) -> None:
    alice, bob = tenants["alice"], tenants["bob"]
    for _ in range(5):
        assert (await alice.run(BIG_CELL, "big")).status == "ok"
    size = journal_of(alice, "big").stat().st_size
    assert 50 << 20 < size <= 64 << 20, size  # ~60 MiB: near the budget
    await bob.run("1+1", "warm")
    rss = alice.rss_kib()
    reset_peak(alice.pid)
    during: list[float] = []
    exported: dict[str, Any] = {}

    async def export() -> None:
        began = time.monotonic()
        exported["file"] = await alice.call("export_notebook", session="big", path="big.ipynb")
        exported["bob's calls by then"] = len(during)
        exported["inline"] = await alice.call("export_notebook", session="big")
        exported["took"] = time.monotonic() - began

    async with anyio.create_task_group() as tg:
        tg.start_soon(export)
        await anyio.sleep(0.05)  # the export has begun
        while "took" not in exported:
            during.append((await bob.run("1+1", "warm")).seconds)
    peak = alice.peak_kib() - rss
    (failed, text), (failed_too, why) = exported["file"], exported["inline"]
    assert not failed and text.startswith("Wrote the notebook of session 'big' to big.ipynb: 5 cells"), text
    # Without a path: where it is and that the resource cannot serve it whole, never the notebook.
    assert not failed_too and "too big for the resource" in why and "path='big.ipynb'" in why, why
    written = alice.state_dir / "exports" / "big.ipynb"
    nb = nbformat.read(written, as_version=4)
    assert len(nb.cells) == 5 and written.stat().st_size > 50 << 20
    # Bob's calls went on while her file was written: an export that held the bridge would let one
    # of his calls through, when it ended (how much slower they were: bench/bench_tenants.py).
    assert exported["bob's calls by then"] >= 3, (exported["bob's calls by then"], during)
    assert peak < PER_SESSION_BOUND, peak
    await alice.close("big")
    await bob.close("warm")
    print(f"\nexport of a {size >> 20} MiB journal: {exported['took']:.1f} s, "
          f"bridge peak +{peak // MiB} MiB; bob's 1+1 during it: median "
          f"{statistics.median(during) * 1000:.1f} ms ({len(during)} calls)")  # fmt: skip


async def test_a_restore_of_forged_cells_is_bounded_by_its_timeout(tenants: dict[str, Bridge]) -> None:
    """Cells a "person" typed (no timeout recorded), each sleeping 20 s: the issue's restore took 41 s."""
    alice = tenants["alice"]
    cells = [v4.new_code_cell("import time; time.sleep(20)") for _ in range(3)]
    for cell in cells:
        cell.metadata["kernelbridge"] = {"source": "client", "client": {"username": "a person"}}
    exports = alice.state_dir / "exports"
    exports.mkdir(parents=True, exist_ok=True)
    nbformat.write(v4.new_notebook(cells=cells), exports / "forged.ipynb")
    with hang_guard(60, "a restore of three 20 s cells with timeout=5"):
        result: Result = await alice.run("print('after')", "restored", timeout=5, restore="forged.ipynb")
    assert "the restore's time budget of 5 s ran out" in result.text, result.text
    assert "The restore took" in result.text and result.stdout == "after\n", result.text
    await alice.close("restored")
    print(f"\nrestore of 3 forged 20 s cells with timeout=5: {result.seconds:.1f} s")


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


async def test_one_token_cannot_fill_the_disk_the_others_journal_to(tenants: dict[str, Bridge]) -> None:
    """Exports under new names without end (each a copy of a ~12 MiB journal): refused at the
    token's quota, and the other token exports on."""
    alice, bob = tenants["alice"], tenants["bob"]
    assert (await alice.run(BIG_CELL, "copies")).status == "ok"
    refused = None
    for n in range(40):
        failed, text = await alice.call("export_notebook", session="copies", path=f"copy-{n}.ipynb")
        if failed:
            refused = text
            break
    assert refused is not None and "KERNELBRIDGE_HTTP_DISK_QUOTA" in refused, refused
    used = tree_bytes(alice.state_dir)
    assert used <= 256 << 20, used
    await bob.run("x = 1", "mine")
    failed, text = await bob.call("export_notebook", session="mine", path="mine.ipynb")
    assert not failed, text
    await alice.close("copies")
    await bob.close("mine")
    print(f"\ndisk: alice's exports refused after {n} copies at {used >> 20} MiB of 256 MiB; bob exports on")
