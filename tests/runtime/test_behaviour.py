"""The same behaviour through every real runtime: a bridge (``kernelbridge serve`` over stdio, the
MCP SDK client) on podman and docker, through the engine API and through the CLI.

One scripted session per runtime covers what a user relies on: state and files kept across calls,
a Python error as a result, a timeout that keeps the variables, a cell that ignores the interrupt
(restarted in its container: files kept, variables lost), an out-of-memory kill (a fresh sandbox,
files gone, said so), files placed by the client and read back through a resource, a host MCP
server called from sandboxed code, and no container left once the session is closed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from bridge_harness import uses_state_dir
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from runtime_harness import engine_http

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

RUNTIMES = ["podman-api", "podman-cli", "docker-api", "docker-cli"]
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
EDGE_SERVER = Path(__file__).resolve().parents[1] / "peers" / "edge_server.py"
STUBBORN = (
    "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass"
)


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def structured(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None, text_of(result)
    return result.structured_content


@pytest.fixture(params=RUNTIMES)
def runtime_env(request: pytest.FixtureRequest, sandbox_image: str, tmp_path: Path) -> dict[str, str]:
    """What a user sets to put a bridge on that runtime."""
    name: str = request.param
    env = {"KERNELBRIDGE_RUNTIME": name}
    if name.startswith("docker"):
        env["DOCKER_HOST"] = request.getfixturevalue("docker_url")
    elif name == "podman-api":
        env["CONTAINER_HOST"] = request.getfixturevalue("podman_url")
    servers = tmp_path / "servers.json"
    config = {"edge": {"command": sys.executable, "args": [str(EDGE_SERVER)], "description": "edge cases"}}
    servers.write_text(json.dumps({"mcpServers": config}))
    env["KERNELBRIDGE_SERVERS_CONFIG"] = str(servers)
    return env


def containers_named(env: dict[str, str], name: str) -> list[str]:
    """The containers called ``name`` as the runtime's engine lists them (a session's container
    may come from the warm pool, labelled for no session: its name is what list_sessions gives)."""
    engine = env["DOCKER_HOST"] if "DOCKER_HOST" in env else env.get("CONTAINER_HOST")
    if engine is None:  # podman-cli: the CLI's own view
        import subprocess

        out = subprocess.run(
            ["podman", "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        return out.split()
    filters = json.dumps({"name": [f"^/?{name}$"]})
    with engine_http(engine) as client:
        rows = client.get("/v1.41/containers/json", params={"all": "1", "filters": filters}).json()
    return [row["Names"][0] for row in rows]


async def test_the_same_session_behaves_the_same_on_every_runtime(
    runtime_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        "KERNELBRIDGE_STATE_DIR": str(uses_state_dir(tmp_path / "state")),
        "KERNELBRIDGE_LABELS": os.environ["KERNELBRIDGE_LABELS"],
        **runtime_env,
    }
    params = StdioServerParameters(command=str(KERNELBRIDGE), args=["serve"], env=env)
    session = f"behave-{runtime_env['KERNELBRIDGE_RUNTIME']}"

    async def run(code: str, **args: Any) -> Any:
        return await client.call_tool("run_python", {"code": code, "session": session, **args})

    with anyio.fail_after(300):
        async with Client(params, read_timeout_seconds=120) as client:
            first = await run("x = 41\nopen('kept.txt', 'w').write('kept')\nx + 1")
            assert structured(first)["result"] == "42", text_of(first)

            error = structured(await run("1/0"))
            assert (error["status"], error["error"]["ename"]) == ("error", "ZeroDivisionError")

            slow = structured(await run("import time\ntime.sleep(30)", timeout=2))
            assert (slow["status"], slow["state"]) == ("timeout", "kept")
            assert structured(await run("x"))["result"] == "41"

            stubborn = structured(await run(STUBBORN, timeout=2))
            assert (stubborn["status"], stubborn["state"]) == ("timeout", "lost")
            after = structured(await run("'x' in globals(), open('kept.txt').read()"))
            assert after["result"] == "(False, 'kept')", after  # restarted in its container

            placed = await run("open('in.txt').read()", files={"in.txt": "from the client"})
            assert structured(placed)["result"] == "'from the client'", text_of(placed)
            await run("open('out.txt', 'w').write('from the sandbox')")
            read = await client.read_resource(f"kernelbridge://sessions/{session}/files/out.txt")
            assert read.contents[0].text == "from the sandbox"  # type: ignore[union-attr]

            tool = structured(
                await run("(await mcp_edge.echo(text='hi'))['structuredContent']", servers=["edge"])
            )
            assert tool["result"] == "{'result': 'hi'}", tool

            oom = structured(await run("hog = b'x' * (2 * 1024**3)", timeout=60))
            assert (oom["status"], oom["state"]) == ("kernel_died", "lost"), oom
            fresh = await run("import os\nos.path.exists('kept.txt')")
            assert structured(fresh)["result"] == "False"
            assert "files in /workspace are gone" in text_of(fresh)

            listed = json.loads(text_of(await client.call_tool("list_sessions", {})))
            [container] = [s["container"] for s in listed["sessions"] if s["session"] == session]
            assert containers_named(env, container), f"{container} is not listed by its engine"
            await client.call_tool("close_session", {"session": session})
        assert containers_named(env, container) == []
