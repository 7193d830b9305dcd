"""Tunnel logs on the host stay bounded: per file (rotation) and in number (pruning)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kernelbridge.jupyter.provisioner import prune_logs
from kernelbridge.jupyter.tunnel_process import LOG_FILE_BYTES, configure_logging


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(10):
        path = tmp_path / f"kernelbridge-s-{i}.log"
        path.write_text("x")
        os.utime(path, (1000 + i, 1000 + i))
    prune_logs(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"kernelbridge-s-{i}.log" for i in (7, 8, 9)]


def test_a_flood_of_log_lines_is_capped(tmp_path: Path) -> None:
    log_file = tmp_path / "t.log"
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        configure_logging(str(log_file))
        for _ in range(3000):
            logging.getLogger("kernelbridge.tunnel").info("sandbox kernel: %s", "z" * 2000)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 2 * LOG_FILE_BYTES + 4096
