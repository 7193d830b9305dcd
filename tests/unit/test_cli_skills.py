"""``kernelbridge skills list|show|rm``: the console script over the skills store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernelbridge.hub import save_skill

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
SOURCE = 'def total(rows):\n    """Sum the rows.\n\n    Second line."""\n    return sum(rows)\n'


def cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state)}
    return subprocess.run(
        [str(KERNELBRIDGE), "skills", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_list_show_rm(tmp_path: Path) -> None:
    assert cli(tmp_path, "list").stdout == "no saved tools\n"
    save_skill(tmp_path, "total", SOURCE, "Sum the rows.\n\nSecond line.")
    save_skill(tmp_path, "alpha", "def alpha():\n    return 1\n")
    listed = cli(tmp_path, "list")
    assert listed.returncode == 0
    header, first, second = listed.stdout.splitlines()
    assert header.split() == ["NAME", "SAVED", "(UTC)", "DESCRIPTION"]
    assert first.split()[0] == "alpha" and second.split()[0] == "total"
    assert second.endswith("Sum the rows.")  # first line of the description
    infos = json.loads(cli(tmp_path, "list", "--json").stdout)
    assert [i["name"] for i in infos] == ["alpha", "total"] and infos[1]["saved_at"].endswith("Z")
    shown = cli(tmp_path, "show", "total")
    assert (shown.returncode, shown.stdout) == (0, SOURCE)  # byte for byte, nothing added
    removed = cli(tmp_path, "rm", "total", "alpha")
    assert (removed.returncode, removed.stdout) == (0, "removed total\nremoved alpha\n")
    assert cli(tmp_path, "list").stdout == "no saved tools\n"


def test_failures_are_one_line_with_a_non_zero_status(tmp_path: Path) -> None:
    save_skill(tmp_path, "kept", "def kept():\n    pass\n")
    for args, message in [
        (("show", "missing"), "kernelbridge: no skill named 'missing' is saved\n"),
        (("rm", "missing"), "kernelbridge: no saved tool named 'missing' (see `kernelbridge skills list`)\n"),
    ]:
        result = cli(tmp_path, *args)
        assert (result.returncode, result.stderr) == (1, message)
    bad = cli(tmp_path, "show", "../../etc/passwd")
    assert bad.returncode == 1 and bad.stderr.startswith("kernelbridge: invalid skill name")
    assert len(bad.stderr.splitlines()) == 1
    partly = cli(tmp_path, "rm", "kept", "missing")
    assert partly.returncode == 1 and partly.stdout == "removed kept\n"
    assert cli(tmp_path).returncode == 2  # argparse: an action is required
