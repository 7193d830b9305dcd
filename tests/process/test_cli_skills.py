"""``kernelbridge skills list|show|rm``: the command line over the skills store (in process, and
once through the installed console script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbridge.cli import main
from kernelbridge.hub import save_skill
from kernelbridge.lazy import NEVER_IMPORTED

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
SOURCE = 'def total(rows):\n    """Sum the rows.\n\n    Second line."""\n    return sum(rows)\n'


@pytest.fixture(autouse=True)
def _imports_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` makes some modules unimportable for its process (kernelbridge.lazy): here that is
    the test worker's, whose later tests must import them as before."""
    for name in NEVER_IMPORTED:
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))  # undone: as it was


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERNELBRIDGE_STATE_DIR", str(tmp_path))
    return tmp_path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["skills", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_list_show_rm(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "list") == (0, "no saved tools\n", "")
    save_skill(state, "total", SOURCE, "Sum the rows.\n\nSecond line.")
    save_skill(state, "alpha", "def alpha():\n    return 1\n")
    status, out, _ = cli(capsys, "list")
    assert status == 0
    header, first, second = out.splitlines()
    assert header.split() == ["NAME", "SAVED", "(UTC)", "DESCRIPTION"]
    assert first.split()[0] == "alpha" and second.split()[0] == "total"
    assert second.endswith("Sum the rows.")  # first line of the description
    infos = json.loads(cli(capsys, "list", "--json")[1])
    assert [i["name"] for i in infos] == ["alpha", "total"] and infos[1]["saved_at"].endswith("Z")
    assert cli(capsys, "show", "total") == (0, SOURCE, "")  # byte for byte, nothing added
    assert cli(capsys, "rm", "total", "alpha") == (0, "removed total\nremoved alpha\n", "")
    assert cli(capsys, "list")[1] == "no saved tools\n"


def test_every_namespace_is_listed_and_managed(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelbridge.config import namespace_state_dir

    save_skill(state, "shared", "def shared():\n    pass\n")
    save_skill(namespace_state_dir(state, "alice"), "report", SOURCE, "Alice's report.")
    save_skill(namespace_state_dir(state, "bob"), "report", "def report():\n    pass\n")
    status, out, _ = cli(capsys, "list")
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["shared", "alice/report", "bob/report"]
    infos = json.loads(cli(capsys, "list", "--json")[1])
    assert [(i["name"], i["namespace"]) for i in infos] == [
        ("shared", ""), ("alice/report", "alice"), ("bob/report", "bob")
    ]  # fmt: skip
    assert cli(capsys, "show", "alice/report") == (0, SOURCE, "")
    assert cli(capsys, "rm", "bob/report") == (0, "removed bob/report\n", "")
    assert [i["name"] for i in json.loads(cli(capsys, "list", "--json")[1])] == ["shared", "alice/report"]
    status, _, err = cli(capsys, "show", "../alice/report")
    assert status == 1 and err.startswith("kernelbridge: invalid skill name"), err


def test_failures_are_one_line_and_exit_1(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_skill(state, "kept", "def kept():\n    pass\n")
    assert cli(capsys, "show", "missing") == (1, "", "kernelbridge: no skill named 'missing' is saved\n")
    missing = "kernelbridge: no saved tool named 'missing' (see `kernelbridge skills list`)\n"
    assert cli(capsys, "rm", "missing") == (1, "", missing)
    status, _, err = cli(capsys, "show", "../../etc/passwd")
    assert status == 1 and err.startswith("kernelbridge: invalid skill name") and len(err.splitlines()) == 1
    assert cli(capsys, "rm", "kept", "missing") == (1, "removed kept\n", missing)
    with pytest.raises(SystemExit) as info:
        main(["skills"])  # argparse: an action is required
    assert info.value.code == 2


def test_the_console_script(tmp_path: Path) -> None:
    save_skill(tmp_path, "total", SOURCE)
    result = subprocess.run(
        [str(KERNELBRIDGE), "skills", "show", "total"],
        capture_output=True,
        text=True,
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, SOURCE, "")
