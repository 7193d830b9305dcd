"""Replays bounded in time, and what a replay may do with host servers and the saved tools (issue 13):
cells never get the bridge's maximum timeout from a notebook that names none, a restore stops at
its budget, and ``kernelbridge replay`` calls only the servers the person names, never writing the
store. Sessions run on the local test-double runtime; host servers are tests/peers/edge_server.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from nbformat import v4
from waiting import hang_guard

from kernelbridge.calls import RpcCall
from kernelbridge.config import Settings, load_settings
from kernelbridge.errors import HubError, RpcError
from kernelbridge.hub import Hub, save_skill
from kernelbridge.replay import ReplayTools, replay_cells
from kernelbridge.replay.judge import skipped_unrecorded
from kernelbridge.replay.runner import cell_timeout
from kernelbridge.replay.tools import live_settings
from kernelbridge.session.registry import SessionRegistry
from kernelbridge.testing import LocalProcessRuntime

pytestmark = pytest.mark.anyio
EDGE = Path(__file__).resolve().parents[1] / "peers" / "edge_server.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def code_cell(code: str, **meta: Any) -> Any:
    cell = v4.new_code_cell(code)
    cell.metadata["kernelbridge"] = meta
    return cell


def test_a_cell_without_a_recorded_timeout_gets_the_default_never_the_maximum() -> None:
    assert cell_timeout(code_cell("x", source="client"), 30, 600) == 30
    assert cell_timeout(code_cell("x", timeout=5), 30, 600) == 5
    assert cell_timeout(code_cell("x", timeout=10**9), 30, 600) == 600
    assert cell_timeout(code_cell("x", status="timeout", duration_ms=7500), 30, 600) == 7


async def test_a_restore_stops_at_its_budget(tmp_path: Path) -> None:
    """The forged-cells attack of issue 13: cells that sleep 20 s each, with no timeout recorded."""
    nb = v4.new_notebook(cells=[code_cell("import time\ntime.sleep(20)", source="client") for _ in range(3)])
    nb.cells.append(code_cell("after = 1"))
    settings = Settings(state_dir=tmp_path, warm_pool=0)
    async with (
        LocalProcessRuntime() as runtime,
        SessionRegistry(settings, runtime, image="test-double", agent_hash=None) as registry,
    ):
        await registry.run("r", "1", timeout=30)  # the sandbox is up
        # Without the budget the three cells would take 90 s (the default timeout, 30 s, each).
        with hang_guard(60, "a restore with a budget of 4 s"):
            report = await replay_cells(registry, "r", nb, budget=4)
    verdicts = [(c.verdict, c.why) for c in report.cells]
    assert verdicts[0] == ("error", "timeout: (the original did not raise)")  # interrupted after 4 s
    assert verdicts[1:] == [("skipped", "the restore's time budget of 4 s ran out")] * 3


def edge_config(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "servers.json"
    servers = {
        name: {"command": sys.executable, "args": [str(EDGE), "--name", name]} for name in ("edge", "other")
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    return {"HOME": str(tmp_path), "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"),
            "KERNELBRIDGE_SERVERS_CONFIG": str(config)}  # fmt: skip


RECORDED = code_cell(
    "...",
    servers=["edge", "other"],
    tool_calls=[
        {"server": "other", "tool": "echo", "arguments": {"text": "x"}, "ok": True,
         "result": {"content": [{"type": "text", "text": "recorded x"}], "structuredContent": None,
                    "isError": False}},
    ],
)  # fmt: skip


async def test_replay_calls_only_the_servers_named_and_never_writes_the_store(tmp_path: Path) -> None:
    env = edge_config(tmp_path)
    settings = load_settings(env)
    save_skill(settings.state_dir, "kept", "def kept():\n    return 1\n")
    with pytest.raises(HubError, match="unknown server 'github'"):
        live_settings(settings, ["github"])
    hub_settings, live = live_settings(settings, ["edge"])
    assert live == ["edge"]
    async with Hub(hub_settings, env=env) as hub:
        assert hub.server_names() == ["edge"]  # the replay's hub sees the named server only
        tools = ReplayTools([RECORDED], settings, hub, live)
        grants = frozenset(tools.validate_grants(["edge", "other"]))
        tools.begin(RECORDED)

        async def rpc(method: str, **params: Any) -> Any:
            with anyio.fail_after(30):
                return await tools.dispatch(RpcCall("replay", grants, method, params))

        live_answer = await rpc("call_tool", server="edge", tool="echo", arguments={"text": "hi"})
        recorded = await rpc("call_tool", server="other", tool="echo", arguments={"text": "x"})
        assert recorded["content"][0]["text"] == "recorded x"
        assert "hi" in json.dumps(live_answer)
        manifest = await rpc("manifest")
        assert sorted(s["name"] for s in manifest["servers"]) == ["edge", "other"]
        with pytest.raises(RpcError) as refused:
            await rpc("save_tool", name="evil", source="def evil():\n    pass\n")
        assert refused.value.kind == "denied" and "refused during a replay" in refused.value.message
        assert (await rpc("load_skill", name="kept"))["source"].startswith("def kept")
        assert [s["name"] for s in (await rpc("list_skills"))["skills"]] == ["kept"]
        assert hub.client("edge").state.value == "ready"
    logs = settings.logs_dir / "hub"
    assert (logs / "edge.log").exists() and not (logs / "other.log").exists()  # "other" never started
    assert sorted(p.name for p in (settings.state_dir / "skills").glob("*.py")) == ["kept.py"]


async def test_without_a_grant_nothing_is_live(tmp_path: Path) -> None:
    settings = load_settings(edge_config(tmp_path))
    tools = ReplayTools([RECORDED], settings, None, [])
    grants = frozenset(tools.validate_grants(["other"]))
    with pytest.raises(HubError, match=r"not in the recording .*--grant nope"):
        tools.validate_grants(["nope"])
    tools.begin(RECORDED)
    answer = await tools.dispatch(
        RpcCall(
            "replay", grants, "call_tool", {"server": "other", "tool": "echo", "arguments": {"text": "x"}}
        )
    )
    assert answer["content"][0]["text"] == "recorded x"
    partial = code_cell("...", tool_calls=[{"server": "edge", "tool": "echo", "arguments_truncated": True}])
    assert tools.unrecorded(partial) == ["edge"] and tools.unrecorded(RECORDED) is None
    assert skipped_unrecorded(4, ["edge"]).why == (
        "its host tool calls were not recorded in full (`kernelbridge replay --grant edge` calls them live)"
    )


async def test_a_restore_source_is_read_in_a_worker_and_names_no_host_path(tmp_path: Path) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    from kernelbridge.server.restore import load_source

    settings = Settings(state_dir=tmp_path / "state")
    (settings.state_dir / "exports").mkdir(parents=True)
    (settings.state_dir / "exports" / "bad.ipynb").write_text("{not json")
    nb = v4.new_notebook(cells=[code_cell("print(1)")])
    nb.cells[0].outputs = [v4.new_output("display_data", data={"image/png": "iVBORw0KGgo" + "A" * 100_000})]
    nbformat.write(nb, settings.state_dir / "exports" / "good.ipynb")
    reader = anyio.CapacityLimiter(1)
    with anyio.fail_after(60):
        loaded = await load_source(settings, "good.ipynb", reader)
        assert len(loaded.cells[0].outputs[0]["data"]["image/png"]) == 64  # its header only
        for name in ("missing.ipynb", "bad.ipynb", "kernelbridge://sessions/nobody/notebook"):
            with pytest.raises(ToolError) as refused:
                await load_source(settings, name, reader)
            assert str(tmp_path) not in str(refused.value) and "\n" not in str(refused.value), refused.value
