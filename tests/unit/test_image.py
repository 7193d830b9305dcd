"""kernelbridge.image without a container runtime: the agent hash, profiles, extras and the image name."""

from __future__ import annotations

import functools
import io
import shutil
import tarfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelbridge import image
from kernelbridge.cli.setup import entry_env
from kernelbridge.config import IMAGE_PROFILES, load_settings
from kernelbridge.errors import AgentMismatch, ConfigError, ImageError
from kernelbridge.image import build, containerfile, recipe, rootfs
from kernelbridge.testing import MemoryImages

REPO = Path(image.__file__).resolve().parents[2]
INSIDE = image.INSIDE_PACKAGE
INSIDE_FILE = max(
    (name for name in image.image_files(REPO) if name.startswith(f"{INSIDE}/")),
    key=lambda name: (REPO / name).stat().st_size,
)
"""The largest file of the code that runs inside the container (whatever its modules are called)."""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of just the files that go into the image."""
    for name in image.image_files(REPO):
        target = image.source_path(tmp_path, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image.source_path(REPO, name), target)
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
        "kernelbridge/transitions.py",
        INSIDE_FILE,
        "sandbox_kernel_image/requirements.txt",
        "sandbox_kernel_image/customize.sh",
        "sandbox_kernel_image/Containerfile",
    ):
        assert name in files
    assert files == sorted(files)
    # Only what runs in the sandbox: host settings and the bridge never make an image stale.
    for host_only in ("kernelbridge/image/recipe.py", "kernelbridge/__init__.py", "kernelbridge/config.py"):
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
    [INSIDE_FILE, "kernelbridge/frames.py", "sandbox_kernel_image/requirements.txt"],
)
def test_hash_changes_when_an_image_file_changes(tree: Path, name: str) -> None:
    before = image.agent_hash(tree)
    with image.source_path(tree, name).open("a") as file:
        file.write("\n# changed\n")
    assert image.agent_hash(tree) != before


def test_hash_changes_when_a_sandbox_module_is_added(tree: Path) -> None:
    before = image.agent_hash(tree)
    (tree / INSIDE / "extra").mkdir()
    (tree / INSIDE / "extra/helpers.py").write_text("X = 1\n")
    assert image.agent_hash(tree) != before
    assert f"{INSIDE}/extra/helpers.py" in image.image_files(tree)


def test_hash_ignores_bytecode_and_baked_hash(tree: Path) -> None:
    before = image.agent_hash(tree)
    cache = tree / INSIDE / "__pycache__"
    cache.mkdir()
    (cache / "agent.cpython-311.pyc").write_bytes(b"\0" * 16)
    (cache / "stray.py").write_text("not source\n")
    (tree / INSIDE / "AGENT_HASH").write_text("0" * 64 + "\n")
    assert image.agent_hash(tree) == before


def test_hash_ignores_files_outside_the_image(tree: Path) -> None:
    before = image.agent_hash(tree)
    (tree / "kernelbridge/server.py").write_text("# host only\n")
    (tree / "kernelbridge/sandbox_kernel_image/README.md").write_text("notes\n")
    assert image.agent_hash(tree) == before


def test_moving_bytes_across_files_changes_the_hash(tree: Path) -> None:
    before = image.agent_hash(tree)
    first, second = tree / "kernelbridge/frames.py", tree / INSIDE_FILE
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(a + b[:1])
    second.write_bytes(b[1:])
    assert image.agent_hash(tree) != before


def test_missing_source_file_is_an_image_error(tree: Path) -> None:
    (tree / "kernelbridge/sandbox_kernel_image/Containerfile").unlink()
    with pytest.raises(ImageError, match="Containerfile"):
        image.agent_hash(tree)


def test_image_tag_format() -> None:
    hash_ = "0123456789abcdef" * 4
    assert image.image_tag(hash_) == "localhost/kernelbridge-sandbox:0123456789abcdef"
    assert image.default_image() == image.image_tag(image.agent_hash())


def test_import_changes_come_from_the_containerfile() -> None:
    labels = {image.HASH_LABEL: "ab" * 32, image.PACKAGES_LABEL: "numpy==2.0 pandas==2.2"}
    changes = containerfile.import_changes(REPO / "sandbox_kernel_image/Containerfile", labels)
    assert "ENV PYTHONPATH=/opt/kernelbridge" in changes
    assert "ENV MPLBACKEND=module://matplotlib_inline.backend_inline" in changes
    assert "WORKDIR /workspace" in changes
    (cmd,) = [
        line
        for line in (REPO / "sandbox_kernel_image/Containerfile").read_text().splitlines()
        if line.startswith("CMD ")
    ]
    assert cmd.startswith('CMD ["python3", "-P", "-m", "kernelbridge.') and cmd in changes
    assert f"LABEL kernelbridge.agent-hash={'ab' * 32}" in changes
    # podman import reads a change like a Containerfile line: a value with spaces is quoted.
    assert 'LABEL kernelbridge.packages="numpy==2.0 pandas==2.2"' in changes
    assert not [change for change in changes if change.startswith(("RUN", "COPY", "FROM"))]


def test_staged_agent_carries_its_hash(tree: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "staged"
    recipe.stage_agent(tree, prefix, "f" * 64)
    assert (prefix / INSIDE_FILE).is_file()
    assert (prefix / INSIDE / "AGENT_HASH").read_text() == "f" * 64 + "\n"
    assert not (prefix / "sandbox_kernel_image").exists()


def test_missing_mmdebstrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rootfs.shutil, "which", lambda name: None)
    labels = {image.HASH_LABEL: "0" * 64}
    with pytest.raises(ImageError, match="apt-get install mmdebstrap"):
        anyio.run(rootfs.make_rootfs, REPO, tmp_path, labels, image.DEFAULT_CONTENTS, lambda line: None)


# -- the recipe ships in the package -------------------------------------------------------------------
def test_the_packaged_recipe_is_the_top_level_directory() -> None:
    """People edit ``sandbox_kernel_image/``; the package's copy must be that very directory (a
    symlink in a checkout, which a wheel or sdist turns into files), never a second copy."""
    packaged = REPO / "kernelbridge" / "sandbox_kernel_image"
    assert packaged.is_symlink(), "kernelbridge/sandbox_kernel_image must be a symlink in a checkout"
    assert packaged.resolve() == (REPO / "sandbox_kernel_image").resolve()
    for name in image.RECIPE_FILES:
        assert (packaged / name).read_bytes() == (REPO / "sandbox_kernel_image" / name).read_bytes()


def test_recipe_files_are_package_data() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "sandbox_kernel_image/*" in config["tool"]["setuptools"]["package-data"]["kernelbridge"]


# -- extra packages ------------------------------------------------------------------------------------
def test_without_extras_the_image_hash_is_the_agent_hash() -> None:
    assert image.image_hash() == image.agent_hash()
    assert image.default_image() == image.image_tag(image.agent_hash())


def test_extras_change_the_image_name_and_not_the_agent() -> None:
    sklearn = image.DEFAULT_CONTENTS.plus(["scikit-learn"])
    both = sklearn.plus(["polars>=1,<2"])
    names = {image.default_image(), image.default_image(sklearn), image.default_image(both)}
    assert len(names) == 3
    # The same list gives the same image, whatever the spelling of duplicates.
    assert image.default_image(both.plus(["scikit-learn"])) == image.default_image(both)
    assert both.extra_names() == ["scikit-learn", "polars"]


@pytest.mark.parametrize(
    "bad", ["-r other.txt", "https://example.com/x.whl", "./local", "pkg @ file:///x", ""]
)
def test_extras_accept_requirements_only(bad: str) -> None:
    with pytest.raises(ConfigError, match="not a package requirement"):
        image.DEFAULT_CONTENTS.plus([bad])


def test_contents_from_settings_read_the_requirements_file(tmp_path: Path) -> None:
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("# mine\nscikit-learn>=1.4  # trees\n\npolars\n")
    settings = load_settings(
        {
            "KERNELBRIDGE_STATE_DIR": str(tmp_path),
            "KERNELBRIDGE_IMAGE_REQUIREMENTS": str(reqs),
            "KERNELBRIDGE_IMAGE_PACKAGES": "sympy, polars",
        }
    )
    extras = image.contents_from_settings(settings)
    assert extras.extras == ("scikit-learn>=1.4", "polars", "sympy")
    before = image.default_image(extras)
    reqs.write_text("scikit-learn>=1.5\npolars\n")
    assert image.default_image(image.contents_from_settings(settings)) != before


def test_an_unreadable_requirements_file_is_one_line(tmp_path: Path) -> None:
    settings = load_settings(
        {"KERNELBRIDGE_STATE_DIR": str(tmp_path), "KERNELBRIDGE_IMAGE_REQUIREMENTS": str(tmp_path / "nope")}
    )
    with pytest.raises(ConfigError, match=r"KERNELBRIDGE_IMAGE_REQUIREMENTS=.*cannot read it"):
        image.contents_from_settings(settings)


# -- labels --------------------------------------------------------------------------------------------
def test_check_labels_explains_a_plain_image() -> None:
    with pytest.raises(
        ImageError, match=r"python:3.14-slim is not a kernelbridge sandbox image.*image build"
    ):
        image.check_labels("python:3.14-slim", {"org.opencontainers.image.version": "3.14"}, "a" * 64)


def test_check_labels_refuses_another_agent() -> None:
    labels = {image.HASH_LABEL: "b" * 64, image.VERSION_LABEL: "0.0.9"}
    with pytest.raises(AgentMismatch, match=r"agent of kernelbridge 0\.0\.9.*rebuild it with"):
        image.check_labels("old:tag", labels, "a" * 64)
    image.check_labels("ok:tag", {image.HASH_LABEL: "a" * 64}, "a" * 64)
    with pytest.raises(ImageError, match="missing"):
        image.check_labels("gone:tag", None, "a" * 64)


def test_status_uses_the_image_hash_and_accepts_older_labels() -> None:
    assert image.labels_status(None, "h") == "missing"
    assert image.labels_status({image.HASH_LABEL: "h"}, "h") == "current"
    assert image.labels_status({image.HASH_LABEL: "a", image.IMAGE_HASH_LABEL: "h"}, "h") == "current"
    assert image.labels_status({image.HASH_LABEL: "h", image.IMAGE_HASH_LABEL: "x"}, "h") == "stale"


def test_packages_label_lists_wanted_packages_with_versions(tmp_path: Path) -> None:
    for name, version in (("numpy", "2.1.0"), ("scikit_learn", "1.5.2"), ("joblib", "1.4.0")):
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    installed = rootfs.installed_packages(tmp_path)
    assert installed == {"numpy": "2.1.0", "scikit-learn": "1.5.2", "joblib": "1.4.0"}
    label = image.packages_label(installed, ["numpy", "scikit-learn", "absent"])
    assert label == "numpy==2.1.0 scikit-learn==1.5.2"
    assert image.parse_packages(label) == ["numpy==2.1.0", "scikit-learn==1.5.2"]


# -- unshare mode --------------------------------------------------------------------------------------
def test_subid_ranges_are_read_by_name_or_uid(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:100000:65536\n1001:200000:1000\nbob:300000:65536\n")
    assert rootfs._subid_range(subuid, "alice", 1000) == 65536
    assert rootfs._subid_range(subuid, "carol", 1001) == 1000
    assert rootfs._subid_range(subuid, "dave", 1002) is None
    assert rootfs._subid_range(tmp_path / "absent", "alice", 1000) is None


def test_the_work_tree_becomes_readable_for_unshare_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    (work / "overlay").mkdir(parents=True)
    script = work / "customize.sh"
    script.write_text("true\n")
    script.chmod(0o700)
    work.chmod(0o700)
    monkeypatch.setattr(rootfs.os, "geteuid", lambda: 1000)
    rootfs._readable_by_others(work)
    assert work.stat().st_mode & 0o777 == 0o755
    assert script.stat().st_mode & 0o777 == 0o755
    assert (work / "overlay").stat().st_mode & 0o005 == 0o005


# -- the builder, through an image store ---------------------------------------------------------------
def tiny_tarball(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        data = b"tiny\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def run(coro: Any, *args: Any, **kwargs: Any) -> Any:
    return anyio.run(functools.partial(coro, *args, **kwargs))


def test_a_current_image_is_kept_and_named_latest(tmp_path: Path) -> None:
    store = MemoryImages()
    tag = image.default_image()
    labels = [
        f"LABEL {image.HASH_LABEL}={image.agent_hash()}",
        f"LABEL {image.IMAGE_HASH_LABEL}={image.image_hash()}",
    ]
    run(store.import_rootfs, tiny_tarball(tmp_path / "t.tar"), tag, labels)
    lines: list[str] = []
    assert run(image.build_image, store, log=lines.append) == tag
    assert lines == [f"sandbox image {tag} is current"]
    assert run(image.image_status, store, f"{image.REPOSITORY}:latest") == "current"
    assert run(image.image_status, store, tag) == "current"
    assert (
        run(image.image_status, store, image.default_image(image.DEFAULT_CONTENTS.plus(["six"]))) == "missing"
    )


def test_the_containerfile_builder_stages_what_the_recipe_copies(tmp_path: Path) -> None:
    """``--containerfile`` through a store: the recipe's Containerfile gets a context with every
    file it copies and the build args its labels read (the double checks both)."""
    store = MemoryImages()
    extras = image.DEFAULT_CONTENTS.plus(["six"])
    with pytest.raises(ImageError, match="registry is reachable"):  # no base image: no pull here
        run(image.build_image, store, containerfile=True, contents=extras, log=lambda line: None)
    run(store.import_rootfs, tiny_tarball(tmp_path / "t.tar"), "docker.io/library/debian:bookworm-slim", [])
    tag = run(image.build_image, store, containerfile=True, contents=extras, log=lambda line: None)
    assert tag == image.default_image(extras)
    labels = run(store.labels, tag)
    assert labels[image.HASH_LABEL] == image.agent_hash()
    assert labels[image.IMAGE_HASH_LABEL] == image.image_hash(extras)
    assert labels[image.PACKAGES_LABEL].split()[-1] == "six", "the requested names (no versions yet)"
    assert run(image.image_status, store, tag, extras) == "current"
    assert run(store.labels, f"{image.REPOSITORY}:latest") is None, "only the plain image is :latest"


def test_old_images_are_pruned_but_the_newest_and_the_used_are_kept(tmp_path: Path) -> None:
    used: set[str] = set()
    store = MemoryImages(in_use=lambda: used)
    tarball = tiny_tarball(tmp_path / "t.tar")
    mark = [f"LABEL {image.HASH_LABEL}=x"]
    old = [f"{image.REPOSITORY}:old{i}" for i in range(7)]  # oldest first
    for ref in old:
        run(store.import_rootfs, tarball, ref, mark)
    used.add(old[0])
    # A rebuild under the same tag leaves the previous image untagged (dangling).
    keep = f"{image.REPOSITORY}:current"
    run(store.import_rootfs, tarball, keep, mark)
    run(store.import_rootfs, tarball, keep, mark)
    other = "localhost/someone-else:1"
    run(store.import_rootfs, tarball, other, [])
    lines: list[str] = []
    run(build._remove_other_images, store, keep, lines.append)
    left = {t for i in run(store.list) for t in i.tags}
    assert left == {keep, other, old[0], *old[-build.KEEP_IMAGES :]}
    assert f"kept old image {old[0]} (in use)" in lines
    assert [i for i in run(store.list) if not i.tags] == [], "the dangling image went too"
    # old1 and old2 (past the newest four, not in use) and the dangling image.
    assert sum(line.startswith("removed old image") for line in lines) == 3


# -- profiles ------------------------------------------------------------------------------------------
MINIMAL = image.ImageContents("minimal")
CORE = ["ipykernel", "numpy", "pandas", "matplotlib", "pillow", "installer"]
ANALYSIS = ["scipy", "scikit-learn", "seaborn", "sympy", "statsmodels", "pyarrow", "ipywidgets"]


def test_every_profile_names_recipe_files() -> None:
    assert set(image.PROFILE_REQUIREMENTS) == set(IMAGE_PROFILES)
    for files in image.PROFILE_REQUIREMENTS.values():
        assert set(files) <= set(image.RECIPE_FILES)
    assert recipe.requested_packages(MINIMAL) == CORE, "the minimal profile is the core set"
    assert recipe.requested_packages(image.DEFAULT_CONTENTS) == CORE + ANALYSIS
    assert recipe.requested_packages(MINIMAL.plus(["polars>=1"])) == [*CORE, "polars"]


def test_the_profile_names_another_image_with_the_same_agent() -> None:
    names = {
        image.default_image(),
        image.default_image(MINIMAL),
        image.default_image(image.DEFAULT_CONTENTS.plus(["six"])),
        image.default_image(MINIMAL.plus(["six"])),
    }
    assert len(names) == 4
    assert image.default_image(image.ImageContents("full")) == image.default_image()
    assert not MINIMAL.is_default and image.ImageContents("full").is_default
    # No extras line can make a full image take the minimal one's name (the parts are NUL-separated).
    lookalike = image.DEFAULT_CONTENTS.plus(["profile=minimal"])
    assert image.image_hash(lookalike) != image.image_hash(MINIMAL)
    with pytest.raises(ConfigError, match="not a package requirement"):
        image.DEFAULT_CONTENTS.plus(["six\0profile=minimal"])


def test_the_profile_setting(tmp_path: Path) -> None:
    base = {"KERNELBRIDGE_STATE_DIR": str(tmp_path)}
    assert load_settings(base).image_profile == "full"
    assert image.contents_from_settings(load_settings(base)) == image.DEFAULT_CONTENTS
    settings = load_settings(
        {**base, "KERNELBRIDGE_IMAGE_PROFILE": "Minimal", "KERNELBRIDGE_IMAGE_PACKAGES": "six"}
    )
    assert image.contents_from_settings(settings) == MINIMAL.plus(["six"])
    with pytest.raises(ConfigError, match=r"^KERNELBRIDGE_IMAGE_PROFILE='tiny': expected full or minimal$"):
        load_settings({**base, "KERNELBRIDGE_IMAGE_PROFILE": "tiny"})
    kept = load_settings({**base, "KERNELBRIDGE_IMAGE_PROFILE": "tiny"}, strict=False)
    assert kept.image_profile == "full" and len(kept.problems) == 1


def test_a_minimal_build_is_labelled_with_its_profile_and_packages(tmp_path: Path) -> None:
    """Through the Containerfile builder and the double: what the registry-free build labels the
    same way (its packages label is tested with real wheels in the integration test)."""
    store = MemoryImages()
    run(store.import_rootfs, tiny_tarball(tmp_path / "t.tar"), "docker.io/library/debian:bookworm-slim", [])
    tag = run(image.build_image, store, containerfile=True, contents=MINIMAL, log=lambda line: None)
    assert tag == image.default_image(MINIMAL)
    labels = run(store.labels, tag)
    assert labels[image.PROFILE_LABEL] == "minimal"
    assert labels[image.IMAGE_HASH_LABEL] == image.image_hash(MINIMAL)
    assert labels[image.HASH_LABEL] == image.agent_hash(), "the same agent as the full image"
    assert labels[image.PACKAGES_LABEL].split() == CORE
    assert run(image.image_status, store, tag, MINIMAL) == "current"
    assert run(image.image_status, store, tag) == "stale", "a full-profile bridge does not take it"
    assert run(store.labels, f"{image.REPOSITORY}:latest") is None, ":latest is the default image only"
    args = containerfile.build_args(REPO, labels, MINIMAL)
    assert args["REQUIREMENTS"] == "requirements.txt" and args["PROFILE"] == "minimal"
    assert containerfile.build_args(REPO, labels, image.DEFAULT_CONTENTS)["REQUIREMENTS"] == (
        "requirements.txt requirements-analysis.txt"
    )


def test_the_packages_label_lists_the_profile_s_packages_only(tmp_path: Path) -> None:
    # scipy arrives as a dependency of a minimal image's extra: installed, but not asked for.
    for name in ("numpy", "scipy", "polars"):
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    installed = rootfs.installed_packages(tmp_path)
    label = image.packages_label(installed, recipe.requested_packages(MINIMAL.plus(["polars"])))
    assert label == "numpy==1.0 polars==1.0"


def test_the_entry_carries_the_profile_built() -> None:
    settings = load_settings({"KERNELBRIDGE_STATE_DIR": "/tmp/kb-state"})
    env = {"KERNELBRIDGE_IMAGE_PROFILE": "minimal", "KERNELBRIDGE_STATE_DIR": "/tmp/kb-state"}
    assert entry_env(settings, MINIMAL, env={})["KERNELBRIDGE_IMAGE_PROFILE"] == "minimal"
    # `setup --profile full` under KERNELBRIDGE_IMAGE_PROFILE=minimal: the entry says the default.
    assert "KERNELBRIDGE_IMAGE_PROFILE" not in entry_env(settings, image.DEFAULT_CONTENTS, env=env)
    assert entry_env(settings, MINIMAL.plus(["six"]), env=env) == {
        "KERNELBRIDGE_IMAGE_PROFILE": "minimal",
        "KERNELBRIDGE_IMAGE_PACKAGES": "six",
        "KERNELBRIDGE_STATE_DIR": "/tmp/kb-state",
    }
