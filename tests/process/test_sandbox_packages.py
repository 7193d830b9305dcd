"""The kernel's side of ``%pip install`` without a host: the magic's own parsing (what it takes,
what it refuses before asking anything), ``!pip`` rewritten, and the install's last step (moving a
staged tree into place) all or nothing.

``mcp._packages`` is the sandbox's ``mcp`` package, never importable in this process (here ``mcp``
is the SDK): its checks run in a child Python with the sandbox's path, as the kernel has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from kernelbridge.inside.agent.kernel_process import PYTHONPATH_DIR
from kernelbridge.inside.kernel.pip_magic import parse_install, read_requirements_file, rewrite_shell_pip


def test_the_magic_takes_its_own_options_and_refuses_every_other() -> None:
    assert parse_install(["-U", "-q", "-r", "a.txt", "--requirement=b.txt", "six", "numpy<2"]) == (
        ["six", "numpy<2"],
        ["a.txt", "b.txt"],
        True,
        True,
    )
    for option in ("--index-url", "-i", "--extra-index-url=x", "-e", "--trusted-host", "--target", "--pre"):
        with pytest.raises(UsageError, match="that option is not accepted here"):
            parse_install([option, "six"])
    with pytest.raises(UsageError, match="needs a file name"):
        parse_install(["-r"])


def test_requirements_files_are_read_in_the_sandbox_and_options_in_them_refused(tmp_path: Path) -> None:
    good = tmp_path / "requirements.txt"
    good.write_text(
        "# a comment\nsix==1.16.0  # pinned\n\ntabulate \\\n  >=0.9\nrequests[socks]; python_version > '3'\n"
    )
    assert read_requirements_file(str(good)) == [
        "six==1.16.0",
        "tabulate    >=0.9",
        "requests[socks]; python_version > '3'",
    ]
    bad = tmp_path / "bad.txt"
    bad.write_text("six\n--index-url http://evil.example/simple\n")
    with pytest.raises(UsageError, match=r"bad.txt, line 2: '--index-url .* is an option"):
        read_requirements_file(str(bad))
    with pytest.raises(UsageError, match="cannot read"):
        read_requirements_file(str(tmp_path / "missing.txt"))
    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"x" * (1024 * 1024 + 1))
    with pytest.raises(UsageError, match="not a requirements file"):
        read_requirements_file(str(huge))


def test_shell_pip_lines_become_the_magic() -> None:
    lines = [
        "!pip install six\n",
        "  !pip3 install -q 'numpy<2'\n",
        "!python -m pip list\n",
        "!python3 -m pip show six\n",
        "!{sys.executable} -m pip install tabulate\n",
        "!pipx install black\n",
        "!ls\n",
        "x = '!pip install nothing'\n",
    ]
    assert rewrite_shell_pip(lines) == [
        "get_ipython().run_line_magic('pip', 'install six')\n",
        "  get_ipython().run_line_magic('pip', \"install -q 'numpy<2'\")\n",
        "get_ipython().run_line_magic('pip', 'list')\n",
        "get_ipython().run_line_magic('pip', 'show six')\n",
        "get_ipython().run_line_magic('pip', 'install tabulate')\n",
        "!pipx install black\n",
        "!ls\n",
        "x = '!pip install nothing'\n",
    ]


COMMIT = """
import json, os, sys
from pathlib import Path
from mcp import _packages

base = Path(sys.argv[1])
def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []

def stage(name, files):
    staging = base / f".staging-{name}"
    for path, text in files.items():
        target = staging / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return staging

out = {}
# 1. A first install (with a namespace package directory), moved in whole.
record = "alpha/__init__.py,,\\nalpha-1.0.dist-info/RECORD,,\\n"
first = stage("one", {"site/alpha/__init__.py": "a = 1", "site/ns/one.py": "",
                      "site/alpha-1.0.dist-info/RECORD": record, "bin/alpha": "#!/bin/sh"})
_packages._commit(first, base, ["alpha"])
out["first"] = tree(base / "site")
# 2. A second one sharing the namespace directory, but with a file another distribution owns:
#    nothing of it stays, the first is untouched.
clash = stage("two", {"site/beta/__init__.py": "", "site/ns/two.py": "", "site/alpha/__init__.py": "evil"})
try:
    _packages._commit(clash, base, ["beta"])
    out["clash"] = "installed"
except _packages.PackageError as exc:
    out["clash"] = str(exc)
out["after_clash"] = tree(base / "site")
out["alpha"] = (base / "site" / "alpha" / "__init__.py").read_text()
# 3. An upgrade of alpha: the old version's files go, the new ones come.
upgrade = stage("three", {"site/alpha/__init__.py": "a = 2",
                          "site/alpha-2.0.dist-info/RECORD": "alpha/__init__.py,,\\n"})
out["replaced"] = _packages._commit(upgrade, base, ["alpha"])
out["upgraded"] = tree(base / "site")
out["alpha2"] = (base / "site" / "alpha" / "__init__.py").read_text()
print(json.dumps(out))
"""


def test_the_staged_install_moves_in_all_or_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(PYTHONPATH_DIR), "KERNELBRIDGE_PACKAGES_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(COMMIT), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["first"] == [
        "alpha",
        "alpha-1.0.dist-info",
        "alpha-1.0.dist-info/RECORD",
        "alpha/__init__.py",
        "ns",
        "ns/one.py",
    ]
    assert out["clash"] == "__init__.py is already installed by another package; not replaced"
    assert out["after_clash"] == out["first"], "no file of the refused install stayed"
    assert out["alpha"] == "a = 1"
    assert out["replaced"] == ["alpha"]
    assert "alpha-1.0.dist-info" not in out["upgraded"] and "alpha-2.0.dist-info/RECORD" in out["upgraded"]
    assert out["alpha2"] == "a = 2"
