"""kernelbridge.image without a container runtime: the agent hash and the image name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernelbridge import image
from kernelbridge.errors import ImageError

REPO = Path(image.__file__).resolve().parent.parent


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of just the files that go into the image."""
    for name in image.image_files(REPO):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, target)
    return tmp_path


def test_agent_hash_is_stable_and_hex() -> None:
    first = image.agent_hash()
    assert first == image.agent_hash() == image.agent_hash(REPO)
    assert len(first) == 64
    int(first, 16)


def test_copy_of_the_tree_has_the_same_hash(tree: Path) -> None:
    assert image.agent_hash(tree) == image.agent_hash(REPO)


def test_image_files_cover_agent_imports_and_recipe() -> None:
    files = image.image_files()
    for name in (
        "kernelbridge/frames.py",
        "kernelbridge/sandbox/agent.py",
        "sandbox_kernel_image/requirements.txt",
        "sandbox_kernel_image/customize.sh",
        "sandbox_kernel_image/Containerfile",
    ):
        assert name in files
    assert files == sorted(files)
    # Only what runs in the sandbox: host settings and the bridge never make an image stale.
    for host_only in ("kernelbridge/image.py", "kernelbridge/__init__.py", "kernelbridge/config.py"):
        assert host_only not in files


def test_changing_host_code_keeps_the_hash(tree: Path) -> None:
    before = image.agent_hash(tree)
    for name in ("kernelbridge/config.py", "kernelbridge/__init__.py", "kernelbridge/errors.py"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        with (tree / name).open("a") as file:
            file.write("\n# a new host setting\n")
    assert image.agent_hash(tree) == before


@pytest.mark.parametrize(
    "name",
    ["kernelbridge/sandbox/agent.py", "kernelbridge/frames.py", "sandbox_kernel_image/requirements.txt"],
)
def test_hash_changes_when_an_image_file_changes(tree: Path, name: str) -> None:
    before = image.agent_hash(tree)
    with (tree / name).open("a") as file:
        file.write("\n# changed\n")
    assert image.agent_hash(tree) != before


def test_hash_changes_when_a_sandbox_module_is_added(tree: Path) -> None:
    before = image.agent_hash(tree)
    (tree / "kernelbridge/sandbox/extra").mkdir()
    (tree / "kernelbridge/sandbox/extra/helpers.py").write_text("X = 1\n")
    assert image.agent_hash(tree) != before
    assert "kernelbridge/sandbox/extra/helpers.py" in image.image_files(tree)


def test_hash_ignores_bytecode_and_baked_hash(tree: Path) -> None:
    before = image.agent_hash(tree)
    cache = tree / "kernelbridge/sandbox/__pycache__"
    cache.mkdir()
    (cache / "agent.cpython-311.pyc").write_bytes(b"\0" * 16)
    (cache / "stray.py").write_text("not source\n")
    (tree / "kernelbridge/sandbox/AGENT_HASH").write_text("0" * 64 + "\n")
    assert image.agent_hash(tree) == before


def test_hash_ignores_files_outside_the_image(tree: Path) -> None:
    before = image.agent_hash(tree)
    (tree / "kernelbridge/server.py").write_text("# host only\n")
    (tree / "sandbox_kernel_image/README.md").write_text("notes\n")
    assert image.agent_hash(tree) == before


def test_moving_bytes_across_files_changes_the_hash(tree: Path) -> None:
    before = image.agent_hash(tree)
    first, second = tree / "kernelbridge/frames.py", tree / "kernelbridge/sandbox/agent.py"
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(a + b[:1])
    second.write_bytes(b[1:])
    assert image.agent_hash(tree) != before


def test_missing_source_file_is_an_image_error(tree: Path) -> None:
    (tree / "sandbox_kernel_image/Containerfile").unlink()
    with pytest.raises(ImageError, match="Containerfile"):
        image.agent_hash(tree)


def test_image_tag_format() -> None:
    hash_ = "0123456789abcdef" * 4
    assert image.image_tag(hash_) == "localhost/kernelbridge-sandbox:0123456789abcdef"
    assert image.default_image() == image.image_tag(image.agent_hash())


def test_import_changes_come_from_the_containerfile() -> None:
    changes = image._import_changes(REPO / "sandbox_kernel_image/Containerfile", "ab" * 32)
    assert "ENV PYTHONPATH=/opt/kernelbridge" in changes
    assert "ENV MPLBACKEND=module://matplotlib_inline.backend_inline" in changes
    assert "WORKDIR /workspace" in changes
    assert 'CMD ["python3", "-m", "kernelbridge.sandbox.agent"]' in changes
    assert f"LABEL kernelbridge.agent-hash={'ab' * 32}" in changes
    assert not [change for change in changes if change.startswith(("RUN", "COPY", "FROM"))]


def test_staged_agent_carries_its_hash(tree: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "staged"
    image._stage_agent(tree, prefix, "f" * 64)
    assert (prefix / "kernelbridge/sandbox/agent.py").is_file()
    assert (prefix / "kernelbridge/sandbox/AGENT_HASH").read_text() == "f" * 64 + "\n"
    assert not (prefix / "sandbox_kernel_image").exists()


def test_missing_mmdebstrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(image.shutil, "which", lambda name: None)
    with pytest.raises(ImageError, match="apt-get install mmdebstrap"):
        image._build_without_registry("podman", REPO, tmp_path, "0" * 64, "t", lambda line: None)
