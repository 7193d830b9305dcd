"""``bench/bench_host_mcp.py --quick`` runs to the end and prints its table (the figures of a quick
run are not checked: a busy CI machine makes them noise; ``make bench`` gives real ones)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.podman

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_host_mcp.py"


def test_the_host_mcp_bench_runs_in_quick_mode(sandbox_image: str) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = re.findall(r"^\| `.*` in a cell \| ([\d.]+) ms \| ([\d.]+) ms \| ([\d.]+)x \| [+-][\d.]+ ms \|$",
                      result.stdout, re.MULTILINE)  # fmt: skip
    assert len(rows) == 2, result.stdout
    assert all(float(direct) > 0 and float(sandbox) > 0 for direct, sandbox, _ in rows)
    assert re.search(r"^target ratio <= 2: (met|NOT met)$", result.stdout, re.MULTILINE)
