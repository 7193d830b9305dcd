"""``export_notebook(path=...)`` takes a path from the model: it must not write outside the export
directory, follow a symlink, or leave a file others can read. (The bridge under test runs in this
process over the local test double: the confinement is the bridge's own logic.)"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import anyio
import nbformat
import pytest
from bridge_harness import local_bridge, text_of
from mcp.client.client import Client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def any_exists(*paths: str) -> bool:
    return any(os.path.exists(path) for path in paths)


async def export(client: Client, path: str) -> tuple[bool, str]:
    with anyio.fail_after(60):
        answer = await client.call_tool("export_notebook", {"session": "exp", "path": path})
    return bool(answer.is_error), text_of(answer)


async def with_a_journal(client: Client) -> None:
    with anyio.fail_after(120):
        answer = await client.call_tool("run_python", {"code": "1 + 1", "session": "exp"})
    assert not answer.is_error, text_of(answer)


async def test_paths_outside_the_export_directory_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    state = tmp_path / "state"
    async with local_bridge(state) as client:
        await with_a_journal(client)
        for path in (
            str(outside / "evil.ipynb"),
            "/etc/kbx-evil.ipynb",
            "../../../../tmp/kbx-x.ipynb",
            "a/../../x.ipynb",
            "..",
            "evil.sh",
            "",
            "x" * 600 + ".ipynb",
        ):
            refused, text = await export(client, path)
            assert refused, (path, text)
            assert "Traceback" not in text
    assert list(outside.iterdir()) == []
    assert not any_exists("/etc/kbx-evil.ipynb", "/tmp/kbx-x.ipynb")


async def test_an_export_is_a_private_file_in_the_export_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with local_bridge(state) as client:
        await with_a_journal(client)
        refused, text = await export(client, "reports/monday/run.ipynb")
        assert not refused, text
        inside, _ = await export(client, str(state / "exports" / "absolute.ipynb"))
        assert not inside
    target = state / "exports" / "reports" / "monday" / "run.ipynb"
    nbformat.validate(nbformat.read(str(target), as_version=4))
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert (state / "exports" / "absolute.ipynb").is_file()


async def test_symlinks_in_the_export_directory_are_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    victim = tmp_path / "victim.ipynb"
    victim.write_text("precious")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exports = state / "exports"
    exports.mkdir(parents=True)
    (exports / "link.ipynb").symlink_to(victim)
    (exports / "dirlink").symlink_to(elsewhere)
    async with local_bridge(state) as client:
        await with_a_journal(client)
        replaced, text = await export(client, "link.ipynb")
        refused, text2 = await export(client, "dirlink/x.ipynb")
    # The link at the target is replaced by a file; what it pointed to is untouched.
    assert not replaced, text
    assert victim.read_text() == "precious"
    assert not (exports / "link.ipynb").is_symlink()
    assert json.loads((exports / "link.ipynb").read_text())["nbformat"] == 4
    assert refused and "not a directory" in text2
    assert list(elsewhere.iterdir()) == []


async def test_a_configured_export_directory_is_the_only_place(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    async with local_bridge(tmp_path / "state", KERNELBRIDGE_EXPORT_DIR=str(chosen)) as client:
        await with_a_journal(client)
        ok, _ = await export(client, "a.ipynb")
        refused, _ = await export(client, str(tmp_path / "state" / "exports" / "b.ipynb"))
    assert not ok and refused
    assert (chosen / "a.ipynb").is_file()
    assert os.listdir(chosen) == ["a.ipynb"]
