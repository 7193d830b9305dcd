"""The adoption's handover command (issue 23): what it names and how it starts, checked without a
container. The same attack on a real sandbox is ``tests/security/test_adoption_attacks.py``.

- it names the image's copy of ``inside/handover.py`` by absolute path (where the image builder
  stages it), with an isolated interpreter, in ``/``, as a uid that is neither root nor the
  kernel's, the one the agent accepts by default;
- started exactly so from a directory full of planted modules (a ``kernelbridge`` package, the
  standard-library modules it imports, ``sitecustomize``, ``usercustomize``, a ``.pth`` file),
  with ``PYTHONPATH``, ``PYTHONSTARTUP`` and ``PYTHONUSERBASE`` pointing there too, none of
  them runs: it says in one line that no agent listens, and exits 4.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kernelbridge.host.container import HANDOVER_COMMAND, HANDOVER_ENV, HANDOVER_USER, HANDOVER_WORKDIR
from kernelbridge.image.recipe import source_root, stage_agent
from kernelbridge.inside.agent.adoption import AttachPoint
from kernelbridge.inside.handover import RELAY_UID, SOCKET_ENV
from kernelbridge.testing.runtime import local_path

PLANTED = ("kernelbridge/__init__.py", "kernelbridge/inside/__init__.py", "kernelbridge/inside/handover.py",
           "socket.py", "struct.py", "array.py", "contextlib.py", "time.py", "ctypes/__init__.py",
           "sitecustomize.py", "usercustomize.py")  # fmt: skip


def test_the_command_names_the_images_copy_with_an_isolated_interpreter(tmp_path: Path) -> None:
    python, *flags, script = HANDOVER_COMMAND
    assert python == "/usr/bin/python3" and flags == ["-I", "-S"] and "-m" not in HANDOVER_COMMAND
    stage_agent(source_root(), tmp_path / "opt" / "kernelbridge", "hash")  # as the image builder does
    assert script.startswith("/") and (tmp_path / script.lstrip("/")).is_file(), script
    assert HANDOVER_WORKDIR == "/"
    assert HANDOVER_USER == f"{RELAY_UID}:{RELAY_UID}" and RELAY_UID not in (0, 65534)
    point = AttachPoint(name=f"kernelbridge-test-{os.getpid()}")
    try:
        assert point.relay_uid == RELAY_UID  # the only uid the agent takes an attachment from
    finally:
        point.close()


def test_nothing_planted_in_its_directory_or_environment_runs(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    marks = tmp_path / "marks"
    marks.mkdir()
    for name in PLANTED:
        path = planted / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(marks / name.replace('/', '_'))!r}, 'w').close()\n")
    (planted / "zz.pth").write_text(f"import os; open({str(marks / 'pth')!r}, 'w').close()\n")
    site = planted / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "usercustomize.py").write_text(f"open({str(marks / 'user-site')!r}, 'w').close()\n")
    steering = {"PYTHONPATH": str(planted), "PYTHONSTARTUP": str(planted / "socket.py"),
                "PYTHONUSERBASE": str(planted), "PYTHONINSPECT": "1", "HOME": str(planted)}  # fmt: skip
    done = subprocess.run(
        [local_path(arg) for arg in HANDOVER_COMMAND],
        cwd=planted,  # its own cwd is "/": this is the container's /workspace it no longer uses
        env={**steering, **dict(HANDOVER_ENV), SOCKET_ENV: f"kernelbridge-nobody-{os.getpid()}"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sorted(os.listdir(marks)) == [], done.stderr
    assert done.returncode == 4 and done.stderr.startswith("kernelbridge handover: no agent listens"), done
    assert len(done.stderr.splitlines()) == 1, done.stderr
