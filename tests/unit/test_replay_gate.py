"""``kernelbridge replay`` starts no sandbox that ``serve`` would refuse (issue 23): where the
runtime ignores memory and pid limits, only with ``KERNELBRIDGE_ALLOW_UNLIMITED``, and then the
report says so. On the local test-double runtime, which enforces no limits and says so
(``RuntimeInfo.limits_enforced``); tests/install/test_nonroot.py runs the real case, rootless
podman on cgroup v1."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import nbformat
import pytest
from nbformat import v4

from kernelbridge.config import Settings
from kernelbridge.errors import LimitsNotEnforced
from kernelbridge.replay import replay_notebook
from kernelbridge.replay.runner import UNLIMITED_NOTE
from kernelbridge.testing import LocalProcessRuntime

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_replay_refuses_unlimited_sandboxes_unless_allowed(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    nbformat.write(v4.new_notebook(cells=[v4.new_code_cell("print('hi')", outputs=[])]), path)
    settings = Settings(state_dir=tmp_path / "state")  # every other setting at its default
    async with LocalProcessRuntime() as runtime:
        assert not (await runtime.info()).limits_enforced
        with pytest.raises(LimitsNotEnforced, match="KERNELBRIDGE_ALLOW_UNLIMITED=1"):
            await replay_notebook(settings, path, runtime=runtime)
        assert await runtime.list() == [], "no sandbox was started"
        allowed = dataclasses.replace(settings, allow_unlimited=True)
        report = await replay_notebook(allowed, path, runtime=runtime)
    assert [cell.verdict for cell in report.cells] == ["unexecuted"]
    assert report.notes[0] == UNLIMITED_NOTE and report.text().startswith(f"note: {UNLIMITED_NOTE}")
