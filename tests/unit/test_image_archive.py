"""The sandbox image as a file, without a container runtime: what :mod:`kernelbridge.image.archive`
reads of an archive before loading it, and save/load through the in-memory image store."""

from __future__ import annotations

import functools
import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelbridge import image
from kernelbridge.errors import AgentMismatch, ImageError
from kernelbridge.image.archive import load_image, read_archive, save_image
from kernelbridge.testing import MemoryImages

AGENT = image.agent_hash()


def run(coro: Any, *args: Any, **kwargs: Any) -> Any:
    return anyio.run(functools.partial(coro, *args, **kwargs))


def write_archive(
    path: Path, labels: dict[str, str], tags: list[str], *, layers: int = 1, manifest_first: bool = False
) -> Path:
    """A docker-archive as `podman save` writes it: layers, the config, manifest.json last (or
    first, as other tools may order it)."""
    files: dict[str, bytes] = {f"layer{i}.tar": bytes(range(256)) * 64 for i in range(layers)}
    files["config.json"] = json.dumps({"config": {"Labels": labels}}).encode()
    files["manifest.json"] = json.dumps(
        [{"Config": "config.json", "RepoTags": tags, "Layers": [f"layer{i}.tar" for i in range(layers)]}]
    ).encode()
    order = list(files)
    if manifest_first:  # and the config: the last layer is the file's last member
        order = ["manifest.json", "config.json", *(name for name in files if name.startswith("layer"))]
    with tarfile.open(path, "w") as tar:
        for name in order:
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sandbox_labels(contents: image.ImageContents = image.DEFAULT_CONTENTS) -> dict[str, str]:
    return {
        image.HASH_LABEL: AGENT,
        image.IMAGE_HASH_LABEL: image.image_hash(contents),
        image.PROFILE_LABEL: contents.profile,
        image.VERSION_LABEL: "0.1.0",
    }


def test_an_archive_says_its_tags_and_labels(tmp_path: Path) -> None:
    tag = image.default_image()
    found = read_archive(write_archive(tmp_path / "a.tar", sandbox_labels(), [tag]))
    assert found.tags == (tag,) and found.labels == sandbox_labels()
    assert found.image_hash == AGENT
    # Compressed the same.
    plain = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(plain))
    assert read_archive(tmp_path / "a.tar.gz") == found


@pytest.mark.parametrize("manifest_first", [False, True])
@pytest.mark.parametrize("member", ["layer0.tar", "layer2.tar", "config.json", "manifest.json"])
def test_an_archive_cut_inside_a_member_is_refused(tmp_path: Path, member: str, manifest_first: bool) -> None:
    """Wherever the cut, also inside the last member's data when the manifest came first (every
    member is listed then: tarfile's own check of the data before each header catches it)."""
    whole = write_archive(
        tmp_path / "whole.tar",
        sandbox_labels(),
        [image.default_image()],
        layers=3,
        manifest_first=manifest_first,
    )
    with tarfile.open(whole) as tar:
        info = tar.getmember(member)
    data = whole.read_bytes()
    cut_at = info.offset_data + info.size // 2
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:cut_at])
    with pytest.raises(ImageError, match=r"^cut\.tar .*truncated"):
        read_archive(cut)
    packed = gzip.compress(data)
    (tmp_path / "cut.tar.gz").write_bytes(packed[: len(packed) * cut_at // len(data)])
    with pytest.raises(ImageError, match="truncated"):
        read_archive(tmp_path / "cut.tar.gz")


def test_what_is_no_image_archive_is_refused_in_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tarball\n" * 100)
    with pytest.raises(ImageError, match="not a whole image archive"):
        read_archive(junk)
    rootfs = tmp_path / "rootfs.tar"  # a tarball, but of files, not of an image
    with tarfile.open(rootfs, "w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ImageError, match=r"no manifest\.json"):
        read_archive(rootfs)
    with pytest.raises(ImageError, match="cannot read"):
        read_archive(tmp_path / "absent.tar")


def test_load_refuses_a_foreign_or_stale_image_and_leaves_the_store_alone(tmp_path: Path) -> None:
    store = MemoryImages()
    foreign = write_archive(
        tmp_path / "busybox.tar", {"maintainer": "someone"}, ["docker.io/library/busybox:1"]
    )
    with pytest.raises(ImageError, match=r"^busybox\.tar is not a kernelbridge sandbox image"):
        run(load_image, store, foreign, AGENT)
    stale_labels = {**sandbox_labels(), image.HASH_LABEL: "0" * 64, image.VERSION_LABEL: "0.0.9"}
    stale = write_archive(tmp_path / "old.tar", stale_labels, [image.image_tag("0" * 64)])
    with pytest.raises(AgentMismatch, match=r"kernelbridge 0\.0\.9 .*stale for this kernelbridge"):
        run(load_image, store, stale, AGENT)
    assert run(store.list) == [], "nothing was loaded"


def test_save_and_load_through_a_store(tmp_path: Path) -> None:
    store = MemoryImages()
    minimal = image.ImageContents("minimal")
    tag = image.default_image(minimal)
    changes = [f"LABEL {key}={value}" for key, value in sandbox_labels(minimal).items()]
    (tmp_path / "rootfs.tar").write_bytes(b"")
    with tarfile.open(tmp_path / "rootfs.tar", "w"):
        pass
    run(store.import_rootfs, tmp_path / "rootfs.tar", tag, changes)
    target = tmp_path / "minimal.tar"
    size = run(save_image, store, tag, target, AGENT)
    assert size == target.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []
    run(store.remove, tag)
    loaded = run(load_image, store, target, AGENT)
    assert loaded.tag == tag and loaded.labels == sandbox_labels(minimal)
    assert run(image.image_status, store, tag, minimal) == "current"


def test_load_names_the_image_by_its_hash_whatever_tag_the_file_had(tmp_path: Path) -> None:
    store = MemoryImages()
    retagged = write_archive(tmp_path / "mine.tar", sandbox_labels(), ["registry.example/team/sandbox:v1"])
    loaded = run(load_image, store, retagged, AGENT)
    assert loaded.tag == image.default_image()
    assert run(image.image_status, store, image.default_image()) == "current"


def test_save_refuses_a_missing_image_and_leaves_no_file(tmp_path: Path) -> None:
    store = MemoryImages()
    with pytest.raises(ImageError, match="is missing"):
        run(save_image, store, image.default_image(), tmp_path / "x.tar", AGENT)
    assert list(tmp_path.iterdir()) == []
