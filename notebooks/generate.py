"""Regenerate the example notebooks in this folder from real kernelbridge sessions.

    .venv/bin/python notebooks/generate.py

Each notebook is an ordinary agent session: ``kernelbridge serve`` is started over stdio, driven
with the MCP SDK's client (as an MCP host would), and the session is exported with the
``export_notebook`` tool. The host MCP server of ``host-mcp-tools.ipynb`` is the project's own edge
server (``tests/peers/edge_server.py``), configured for this run only. Needs podman and the
sandbox image, like the bridge itself; the test suite replays every notebook here
(``tests/integration/test_notebooks.py``) and expects ``same`` for every cell.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
CALL_TIMEOUT = 120.0

Call = dict[str, Any]
"""The arguments of one run_python call."""

SESSIONS: dict[str, list[Call]] = {
    "data-analysis": [
        {"code": "import numpy as np\nimport pandas as pd\n\n"
                 "rng = np.random.default_rng(42)\n"
                 "df = pd.DataFrame({'day': range(1, 31), 'visits': rng.poisson(120, 30)})\n"
                 "df['week_mean'] = df.visits.rolling(7).mean().round(1)\n"
                 "df.describe().round(2)"},
        {"code": "import matplotlib.pyplot as plt\n\n"
                 "fig, ax = plt.subplots(figsize=(6, 3))\n"
                 "ax.plot(df.day, df.visits, marker='o', label='visits')\n"
                 "ax.plot(df.day, df.week_mean, label='7-day mean')\n"
                 "ax.set_xlabel('day of the month')\n"
                 "ax.legend()\n"
                 "plt.show()"},
        {"code": "busiest = df.loc[df.visits.idxmax()]\n"
                 "print(f'busiest day: {busiest.day} with {busiest.visits} visits')\n"
                 "df.to_csv('visits.csv', index=False)\n"
                 "import os\n"
                 "os.path.getsize('visits.csv')"},
    ],
    "host-mcp-tools": [
        {"code": "r = await mcp_edge.echo(text='hello from the sandbox')\nr['content'][0]['text']",
         "servers": ["edge"]},
        {"code": "n = await runtime.call_tool('edge', 'length', {'text': 'x' * 1000})\n"
                 "n['content'][0]['text']"},
        {"code": "import asyncio\n\n"
                 "parts = await asyncio.gather(*(mcp_edge.echo(text=w) for w in ['a', 'b', 'c']))\n"
                 "[p['content'][0]['text'] for p in parts]"},
        {"code": "failed = await mcp_edge.fail()\nfailed['isError'], failed['content'][0]['text']"},
    ],
    "error-and-timeout": [
        {"code": "values = [3, 1, 2]\nsorted(values)"},
        {"code": "values[5]"},
        {"code": "import time\n\nprint('working...', flush=True)\ntime.sleep(30)", "timeout": 2},
        {"code": "print('still here:', values)"},
    ],
}  # fmt: skip


async def record(name: str, calls: list[Call], state: Path, servers_config: Path) -> str:
    """Run ``calls`` in session ``name`` of a fresh bridge; return the exported notebook."""
    params = StdioServerParameters(
        command=str(KERNELBRIDGE),
        args=["serve"],
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(state),
             "KERNELBRIDGE_SERVERS_CONFIG": str(servers_config), "KERNELBRIDGE_WARM_POOL": "0"},
        cwd=str(REPO),
    )  # fmt: skip
    async with Client(params, read_timeout_seconds=CALL_TIMEOUT) as client:
        for call in calls:
            result = await client.call_tool("run_python", {**call, "session": name})
            status = (result.structured_content or {}).get("status")
            print(f"  {name}: {status}: {call['code'].splitlines()[0]}")
        exported = await client.call_tool("export_notebook", {"session": name})
    return "".join(block.text for block in exported.content if block.type == "text")


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kernelbridge-notebooks-") as tmp:
        config = Path(tmp) / "servers.json"
        edge = {"command": sys.executable, "args": [str(REPO / "tests" / "peers" / "edge_server.py")],
                "description": "The kernelbridge test suite's edge-case server"}  # fmt: skip
        config.write_text(json.dumps({"mcpServers": {"edge": edge}}))
        for name, calls in SESSIONS.items():
            text = await record(name, calls, Path(tmp) / name, config)
            (HERE / f"{name}.ipynb").write_text(
                text if text.endswith("\n") else text + "\n", encoding="utf-8"
            )
            print(f"wrote notebooks/{name}.ipynb")


if __name__ == "__main__":
    anyio.run(main)
