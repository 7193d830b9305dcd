"""The README's packages and data workflow: ``%pip install`` through the host and a read-only
mount of the user's data, across a client restart, then the session rebuilt from its notebook.

``KERNELBRIDGE_MOUNTS`` is the one setting this journey is about (the user's client entry names
their data directory); everything else is at its default, the package policy (``any``) and the
index (this machine's pip configuration) included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from journey import User, client_of, new_user, warm_pool_ready

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.journey]

ANALYSIS = (
    "import pandas as pd\nfrom tabulate import tabulate\n"
    "frame = pd.read_csv('/data/sales.csv')\n"
    "print(tabulate(frame.groupby('region').sum().reset_index(), tablefmt='plain', showindex=False))"
)


@pytest.fixture
def user(tmp_path: Path, sandbox_image: str) -> User:
    data = tmp_path / "data"
    data.mkdir()
    (data / "sales.csv").write_text("region,amount\nnorth,3\nsouth,4\nnorth,5\n")
    return new_user(tmp_path, KERNELBRIDGE_MOUNTS=f"{data}:/data")


async def test_a_package_and_a_mount_survive_a_restart_and_a_restore(user: User) -> None:
    async with client_of(user) as bridge:
        await warm_pool_ready(bridge)
        installed = await bridge.run("%pip install tabulate", "analysis", timeout=180)
        assert installed.status == "ok" and "Successfully installed" in installed.text, installed.text
        first = await bridge.run(ANALYSIS, "analysis")
        assert first.status == "ok" and first.stdout.split() == ["north", "8", "south", "4"], first.text
        refused = await bridge.run("open('/data/new.csv', 'w')", "analysis")
        assert refused.data["error"]["ename"] == "OSError", refused.text  # read-only
        assert "Read-only file system" in refused.data["error"]["evalue"]

    async with client_of(user) as bridge:
        again = await bridge.run("print(tabulate([[len(frame)]], tablefmt='plain'))", "analysis")
        assert again.status == "ok" and again.stdout == "3\n", again.text
        assert "adopted" in again.codes, again.codes
        # The notebook rebuilt into a new session: the install replayed from the cache, the mount
        # read again.
        restored = await bridge.run(
            "print(len(frame))", "rebuilt", restore="kernelbridge://sessions/analysis/notebook", timeout=300
        )
        assert restored.status == "ok" and restored.stdout.endswith("3\n"), restored.text
        assert "restored" in restored.codes, restored.codes
        for name in ("analysis", "rebuilt"):
            error, said = await bridge.call("close_session", session=name)
            assert not error, said
