"""Host data in a sandbox: operator-granted directories (``KERNELBRIDGE_MOUNTS``, ``serve --mount``)
and, for the kernelspec, the notebook's own directory. Real bridges, real podman containers,
nbclient with the ``kernelbridge`` kernelspec.

A mount is read but never written, runs nothing (``noexec``), its symlinks resolve inside the
sandbox and never reach the host path they name; the state directory (or a directory holding it)
is never mounted.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import anyio
import nbformat
import pytest
from bridge_harness import open_bridge
from durable_harness import pool_filled, wait_for
from nbclient import NotebookClient
from PIL import Image

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

PROBE = r"""
import errno, os, subprocess
verdict = {}
verdict["read"] = open("/data/sales.csv").read()
verdict["nested"] = open("/data/sub/notes.txt").read()
for name in ("absolute", "relative"):
    try:
        verdict[name] = open(f"/data/{name}").read()
    except OSError as exc:
        verdict[name] = errno.errorcode[exc.errno]
verdict["links"] = [os.readlink("/data/absolute"), os.readlink("/data/relative")]
writes = {}
for what, act in {
    "create": lambda: open("/data/new.txt", "w"),
    "append": lambda: open("/data/sales.csv", "a"),
    "remove": lambda: os.remove("/data/sales.csv"),
    "mkdir": lambda: os.mkdir("/data/newdir"),
    "chmod": lambda: os.chmod("/data/sales.csv", 0o777),
}.items():
    try:
        act()
        writes[what] = "done"
    except OSError as exc:
        writes[what] = errno.errorcode[exc.errno]
verdict["writes"] = writes
try:  # noexec: never runs
    verdict["exec"] = subprocess.run(["/data/tool.sh"], capture_output=True).returncode
except OSError as exc:
    verdict["exec"] = errno.errorcode[exc.errno]
options = [line.split()[3] for line in open("/proc/mounts") if line.split()[1] == "/data"]
verdict["options"] = options[0].split(",") if options else []
"""


def files_of(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file() and not p.is_symlink()}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A host directory with data, a script, and symlinks that name host paths outside it."""
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "sales.csv").write_text("region,amount\nnorth,10\nsouth,32\n")
    (root / "sub" / "notes.txt").write_text("nested\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    (root / "absolute").symlink_to(secret)  # an absolute host path outside the mount
    (root / "relative").symlink_to("../secret.txt")  # the same, relative
    tool = root / "tool.sh"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o777)
    # Writable by anyone on the host: what stops the sandbox's user is the read-only mount, not
    # the files' permissions.
    for path in (root, root / "sub"):
        path.chmod(0o777)
    (root / "sales.csv").chmod(0o666)
    return root


async def test_a_mount_is_read_but_not_written_run_or_left_by_a_symlink(
    tmp_path: Path, data: Path, sandbox_image: str
) -> None:
    before = files_of(data)
    env = {"KERNELBRIDGE_MOUNTS": f"{data}:/data"}
    async with open_bridge(tmp_path / "state", **env) as bridge:
        verdict = await bridge.probe(PROBE, "mounted")
        capabilities = (await bridge.client.read_resource("kernelbridge://capabilities")).contents[0].text
    assert verdict["read"].startswith("region,amount") and verdict["nested"] == "nested\n"
    assert verdict["absolute"] == "ENOENT" and verdict["relative"] == "ENOENT", (
        "the host file is not reachable"
    )
    assert verdict["links"] == [str(tmp_path / "secret.txt"), "../secret.txt"]
    assert set(verdict["writes"].values()) == {"EROFS"}, verdict["writes"]
    assert verdict["exec"] == "EACCES"
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(verdict["options"]), verdict["options"]
    after = files_of(data)
    assert after == before and not (data / "new.txt").exists()
    assert "read-only: `/data`" in capabilities and str(data) not in capabilities


async def test_a_mount_taken_away_is_not_seen_by_the_next_bridges_sessions(
    tmp_path: Path, data: Path, sandbox_image: str
) -> None:
    """A user shares a directory, then stops sharing it and restarts the client: the warm
    sandbox the first bridge left has it mounted, so the next bridge removes that one rather than
    pool it, and its first new session does not see the directory."""
    state = tmp_path / "state"
    async with open_bridge(state, KERNELBRIDGE_MOUNTS=f"{data}:/data"):
        await wait_for(lambda: pool_filled(state), "the pool filled: its sandbox ready")
    async with open_bridge(state) as bridge:
        seen = await bridge.run("import os; print(os.path.exists('/data/sales.csv'))", "s")
        assert seen.status == "ok" and seen.stdout == "False\n", seen.text
        await bridge.close("s")


async def test_a_session_that_saw_a_mount_taken_away_since_is_rebuilt_without_it(
    tmp_path: Path, data: Path, sandbox_image: str
) -> None:
    """The same, for a session whose sandbox outlived its bridge: the next bridge does not take
    over a sandbox that still sees the directory: the session's next call says it was lost, and
    the one after runs in a fresh sandbox, which does not see it."""
    state = tmp_path / "state"
    async with open_bridge(state, KERNELBRIDGE_MOUNTS=f"{data}:/data") as bridge:
        assert (await bridge.run("print(open('/data/sales.csv').read(6))", "s")).stdout == "region\n"
    async with open_bridge(state) as bridge:
        probe = "import os; print(os.path.exists('/data/sales.csv'))"
        lost = await bridge.run(probe, "s")
        assert "sandbox_lost" in lost.codes and "no longer shared" in lost.notes, lost.text
        assert (await bridge.run(probe, "s")).stdout == "False\n"  # a fresh sandbox, without it
        await bridge.close("s")


async def test_serve_mount_adds_a_directory_beside_the_setting(
    tmp_path: Path, data: Path, sandbox_image: str
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "weights.txt").write_text("w\n")
    env = {"KERNELBRIDGE_MOUNTS": f"{data}:/data"}
    from bridge_harness import serve_params
    from mcp.client.client import Client

    params = serve_params(tmp_path / "state", "--mount", f"{models}:/workspace/models", **env)
    async with Client(params, read_timeout_seconds=180) as client:
        answer = await client.call_tool(
            "run_python",
            {"code": "print(open('models/weights.txt').read(), open('/data/sales.csv').read()[:6])"},
        )
    text = "\n".join(block.text for block in answer.content if block.type == "text")
    assert "w\n" in text and "region" in text, text


@pytest.mark.parametrize("which", ["state", "parent", "file", "missing", "proc"])
async def test_serve_refuses_a_mount_of_the_state_directory_its_parent_a_host_path_or_a_non_directory(
    tmp_path: Path, which: str
) -> None:
    # The bridge still answers (an MCP client would show only "connection closed" for one that
    # died): every call says the one line.
    from bridge_harness import serve_params
    from mcp.client.client import Client

    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "file.txt").write_text("x")
    source = {
        "state": state,
        "parent": tmp_path,
        "file": tmp_path / "file.txt",
        "missing": tmp_path / "nope",
        "proc": Path("/proc"),
    }[which]
    async with Client(serve_params(state, "--mount", f"{source}:/data"), read_timeout_seconds=60) as client:
        answer = await client.call_tool("run_python", {"code": "print(1)"})
    text = "\n".join(block.text for block in answer.content if block.type == "text")
    assert answer.is_error and "\n" not in text.strip(), text
    assert "kernelbridge is misconfigured: --mount: " in text, text
    why = {"state": "is the state directory", "parent": "holds the state directory",
           "file": "is not a directory", "missing": "does not exist", "proc": "is /proc"}[which]  # fmt: skip
    assert why in text


def test_a_notebook_run_by_nbclient_sees_the_files_beside_it(
    jupyter_env: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "sales.csv").write_text("region,amount\nnorth,10\nsouth,32\n")
    picture = io.BytesIO()
    Image.new("RGB", (7, 5), "orange").save(picture, format="PNG")
    (project / "python.png").write_bytes(picture.getvalue())
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import os, pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(int(df.amount.sum()), os.getcwd())"
        ),
        nbformat.v4.new_code_cell("from PIL import Image\nprint(Image.open('python.png').size)"),
        nbformat.v4.new_code_cell(
            "import errno\ntry:\n    open('out.csv', 'w')\n"
            "except OSError as exc:\n    print(errno.errorcode[exc.errno])"
        ),
        nbformat.v4.new_code_cell("%pip install -q tabulate\nimport tabulate\nprint(tabulate.__file__)"),
    ]
    client = NotebookClient(
        nb,
        kernel_name="kernelbridge",
        timeout=120,
        startup_timeout=120,
        resources={"metadata": {"path": str(project)}},
    )
    client.execute()
    texts = ["".join(o.get("text", "") for o in cell.outputs) for cell in nb.cells]
    assert texts[0] == "42 /workspace\n"
    assert texts[1] == "(7, 5)\n"
    assert texts[2] == "EROFS\n"
    assert texts[3].startswith("/packages/site/tabulate/"), texts[3]
    assert not (project / "out.csv").exists()


def test_a_notebook_beside_the_state_directory_starts_without_its_directory(
    jupyter_env: dict[str, str], tmp_path: Path
) -> None:
    # tmp_path holds the state directory (jupyter_env's): never mounted, the kernel still starts.
    (tmp_path / "beside.txt").write_text("x")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os\nprint(sorted(os.listdir('.')), os.getcwd())")]
    NotebookClient(
        nb,
        kernel_name="kernelbridge",
        timeout=60,
        startup_timeout=120,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    assert nb.cells[0].outputs[0]["text"] == "[] /workspace\n"


def test_nbconvert_executes_a_notebook_that_reads_its_neighbours(
    jupyter_env: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "report"
    project.mkdir()
    (project / "numbers.txt").write_text("1 2 3 4\n")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "kernelbridge", "display_name": "kernelbridge", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("print(sum(map(int, open('numbers.txt').read().split())))")]
    nbformat.write(nb, project / "report.ipynb")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("jupyter")), "nbconvert", "--to", "notebook", "--execute",
         "--output", "done.ipynb", str(project / "report.ipynb")],
        env={**os.environ, **jupyter_env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    done = nbformat.read(project / "done.ipynb", as_version=4)
    assert done.cells[0].outputs[0]["text"] == "10\n"


async def test_a_notebook_records_its_mounts_and_a_replay_without_them_says_so_first(
    tmp_path: Path, data: Path, sandbox_image: str
) -> None:
    """Issue 23: a replay without the original's mount used to say only FileNotFoundError (the
    original did not raise) and blame later cells. The notebook records the mounts' targets (not
    their host paths) and the %pip policy; the replay says up front what it lacks, and the failing
    cell says why."""
    env = {"KERNELBRIDGE_MOUNTS": f"{data}:/data"}
    async with open_bridge(tmp_path / "state", **env) as bridge:
        read = await bridge.run("rows = open('/data/sales.csv').read().splitlines()\nprint(len(rows))", "s")
        assert read.stdout == "3\n", read.text
        text = await bridge.notebook("s")
    nb = nbformat.reads(text, as_version=4)
    assert nb.metadata["kernelbridge"]["sandbox"] == {"mounts": ["/data"], "packages": "any"}
    assert str(data) not in text
    path = tmp_path / "s.ipynb"
    nbformat.write(nb, path)
    with anyio.fail_after(180):
        result = await anyio.run_process(
            [str(Path(sys.executable).with_name("kernelbridge")), "replay", str(path)],
            env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")},
            check=False,
        )
    stdout = result.stdout.decode()
    lines = stdout.splitlines()
    assert result.returncode == 1, stdout + result.stderr.decode()
    assert lines[0] == (
        "note: the original session had a host directory mounted on /data (read-only); this replay"
        " has none there: set KERNELBRIDGE_MOUNTS=SRC:/data to give it one"
    )
    assert lines[1].startswith("cell   1  error      FileNotFoundError: ") and lines[1].endswith(
        "(the original had /data mounted; this replay does not)"
    ), lines[1]
