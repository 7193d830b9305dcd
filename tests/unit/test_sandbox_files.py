"""The agent's file operations on /workspace (``inside/agent/files.py``), on a temporary directory."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from kernelbridge.inside.agent import files


def test_write_read_and_list_round_trip(tmp_path: Path) -> None:
    data = bytes(range(256))
    assert files.write_file(str(tmp_path), "a/b/c.bin", base64.b64encode(data).decode()) == {"size": 256}
    read = files.read_file(str(tmp_path), "a/b/c.bin")
    assert base64.b64decode(read["data"]) == data
    listed = files.list_dir(str(tmp_path), ".")
    assert [(e["path"], e["type"]) for e in listed["entries"]] == [
        ("a", "dir"),
        ("a/b", "dir"),
        ("a/b/c.bin", "file"),
    ]


@pytest.mark.parametrize(
    ("path", "kind"),
    [("missing.txt", "not_found"), ("nodir/missing.txt", "not_found"), ("../x", "invalid_path"),
     ("/etc/passwd", "invalid_path"), ("link", "not_a_file"), ("linkdir/x", "invalid_path")],
)  # fmt: skip
def test_refusals_are_fs_errors_with_a_kind(tmp_path: Path, path: str, kind: str) -> None:
    os.symlink("/etc/passwd", tmp_path / "link")
    os.symlink("/etc", tmp_path / "linkdir")
    with pytest.raises(files.FsError) as refused:
        files.read_file(str(tmp_path), path)
    assert refused.value.kind == kind, refused.value.message
