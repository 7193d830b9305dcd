"""The built sandbox image, through podman: label, contents, and the agent's hello/ready handshake;
the minimal profile's image; the image as a file (``kernelbridge image save`` / ``image load``).

These tests never rebuild: ``ensure_sandbox_image`` builds once (about four minutes here) if the
image is missing or stale, and reuses it afterwards. Its labels and status are read through the
image store of each podman backend (API and CLI), as ``kernelbridge image status`` and the bridge
read them. The minimal profile's image is a second build of minutes (two to three here from a cold
cache), which only these tests need: they are in the install tier (``-m install``), cached by
content like the full image, and built at most once per run (one module-scoped fixture).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge

from kernelbridge import image
from kernelbridge.config import load_settings
from kernelbridge.runtime import open_runtime
from kernelbridge.testing import ensure_sandbox_image

pytestmark = [
    pytest.mark.podman,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]

# The minimum the sandbox needs to start here: the host's default ulimits would be raised past what
# a process without CAP_SYS_RESOURCE may set (see DESIGN.md, "Sandbox container").
RUN = [
    "podman", "run", "--rm", "--network", "none", "--read-only", "--user", "65534:65534",
    "--tmpfs", "/tmp:size=64m", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
    "--log-driver", "passthrough",
]  # fmt: skip
# Bounds a container run: start plus a kernel's start take about a second here.
RUN_TIMEOUT = 60


@pytest.fixture(scope="module")
def tag() -> str:
    return ensure_sandbox_image()


def store_view(runtime: str, tag: str, state: Path) -> tuple[str, str, str, dict[str, str] | None]:
    """(status of ``tag``, of ``:latest``, of a tag that does not exist, ``tag``'s labels), as the
    image store of ``runtime`` reports them."""

    async def ask() -> tuple[str, str, str, dict[str, str] | None]:
        settings = load_settings({"KERNELBRIDGE_RUNTIME": runtime, "KERNELBRIDGE_STATE_DIR": str(state)})
        async with open_runtime(settings) as backend:
            store = backend.images
            return (
                await image.image_status(store, tag),
                await image.image_status(store, f"{image.REPOSITORY}:latest"),
                await image.image_status(store, f"{image.REPOSITORY}:no-such-tag"),
                await store.labels(tag),
            )

    return anyio.run(ask)


@pytest.mark.parametrize("runtime", ["podman-api", "podman-cli"])
def test_image_is_current_and_labelled_with_the_agent_hash(tag: str, runtime: str, tmp_path: Path) -> None:
    assert tag == image.default_image()
    status, latest, missing, labels = store_view(runtime, tag, tmp_path / "state")
    assert (status, latest, missing) == ("current", "current", "missing")
    assert labels is not None
    assert labels[image.HASH_LABEL] == image.agent_hash()
    assert labels[image.IMAGE_HASH_LABEL] == image.image_hash()


def test_image_contents(tag: str) -> None:
    script = (
        "import json, pathlib, ipykernel, numpy, pandas, matplotlib, PIL;"
        "import kernelbridge.inside.agent.hello as agent;"
        "print(json.dumps({'ipykernel': ipykernel.__version__,"
        " 'hash': agent.AGENT_HASH_FILE.read_text().strip(),"
        " 'cached': any(pathlib.Path(ipykernel.__file__).parent.glob('__pycache__/*.cpython-311.pyc'))}))"
    )
    proc = subprocess.run(
        [*RUN, tag, "python3", "-c", script], capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert int(found["ipykernel"].split(".")[0]) >= 7
    assert found["hash"] == image.agent_hash()
    assert found["cached"], "bytecode was not pre-compiled: every kernel start would recompile"


def test_image_runs_the_agent(tag: str) -> None:
    hello = json.dumps({"type": "hello", "key": "k", "session": "t", "agent_hash": image.agent_hash()})
    proc = subprocess.Popen(
        [*RUN, "-i", tag], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(hello.encode() + b"\n")
        proc.stdin.flush()
        # readline has no timeout of its own; the container is killed in `finally` if it hangs,
        # and pytest-timeout bounds the test.
        line = proc.stdout.readline()
        frame = json.loads(line)
        assert frame["type"] == "ready", line
        assert frame["agent_hash"] == image.agent_hash()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


# -- the minimal profile -------------------------------------------------------------------------------
MINIMAL = image.ImageContents("minimal")
CORE = {"ipykernel", "numpy", "pandas", "matplotlib", "pillow", "installer"}
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
ARCHIVE_TIMEOUT = 600
"""Bound of one `kernelbridge image save` or `load` (the minimal image takes seconds each way)."""


def kernelbridge(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user types it, with ``env`` over the test's environment."""
    return subprocess.run(
        [str(KERNELBRIDGE), *args],
        capture_output=True,
        text=True,
        timeout=ARCHIVE_TIMEOUT,
        env={**os.environ, **env},
        check=False,
    )


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=ARCHIVE_TIMEOUT)


@pytest.fixture(scope="module")
def minimal_tag() -> str:
    return ensure_sandbox_image(contents=MINIMAL)


@pytest.mark.install
def test_the_minimal_image_holds_the_core_set_and_says_so(minimal_tag: str, tmp_path: Path) -> None:
    assert minimal_tag == image.default_image(MINIMAL) != image.default_image()
    status, _, _, labels = store_view("podman-cli", minimal_tag, tmp_path / "state")
    assert status == "stale", "a bridge of the default (full) profile never takes the minimal image"
    assert labels is not None and labels[image.PROFILE_LABEL] == "minimal"
    assert labels[image.HASH_LABEL] == image.agent_hash()
    listed = {item.split("==")[0] for item in image.parse_packages(labels[image.PACKAGES_LABEL])}
    assert listed == CORE, "the label (what the manual lists) names the core set only"
    script = (
        "import importlib.util, json, numpy, pandas, matplotlib, PIL, ipykernel, installer;"
        "print(json.dumps([importlib.util.find_spec(m) is None for m in ('scipy', 'sklearn', 'pyarrow')]))"
    )
    proc = subprocess.run(
        [*RUN, minimal_tag, "python3", "-c", script], capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [True, True, True], "the analysis set is left out"
    full = podman("image", "inspect", "--format", "{{.Size}}", image.default_image())
    small = podman("image", "inspect", "--format", "{{.Size}}", minimal_tag)
    if full.returncode == 0:
        assert int(small.stdout) < int(full.stdout) * 0.75, (small.stdout, full.stdout)


DEFAULT_SETTINGS_LOADER = "podman-api"
"""The engine the default settings drive here (``KERNELBRIDGE_RUNTIME=podman``: its API when one
answers): the parametrization loading with it loads under the default settings instead."""


@pytest.mark.install
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("saved_by", "loaded_by"), [("podman-api", "podman-cli"), ("podman-cli", "podman-api")]
)
async def test_the_minimal_image_saved_and_loaded_is_the_one_a_bridge_uses(
    minimal_tag: str, tmp_path: Path, saved_by: str, loaded_by: str
) -> None:
    """`image save` writes the image a bridge with these settings uses; after it is removed,
    `image load` brings it back as current, and a bridge with the minimal profile starts its
    sandboxes from it and tells the model only what it has."""
    profile = {"KERNELBRIDGE_IMAGE_PROFILE": "minimal", "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")}
    archive = tmp_path / "minimal.tar"
    saved = kernelbridge("image", "save", str(archive), KERNELBRIDGE_RUNTIME=saved_by, **profile)
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith(f"saved {minimal_tag} to {archive} ("), saved.stdout
    assert podman("rmi", minimal_tag).returncode == 0, "nothing else uses the minimal image"
    assert kernelbridge("image", "status", **profile).stdout == f"{minimal_tag}: missing\n"
    if loaded_by == DEFAULT_SETTINGS_LOADER:
        # Loaded under the default settings, which expect the full image: the load says how to use
        # this one (a 462 MB file loaded once per parametrization).
        load_env = {"KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")}
        said = "bridges use it with KERNELBRIDGE_IMAGE_PROFILE=minimal"
    else:
        load_env = {"KERNELBRIDGE_RUNTIME": loaded_by, **profile}
        said = f"{minimal_tag}: current (bridges with these settings use it)"
    loaded = kernelbridge("image", "load", str(archive), **load_env)
    assert loaded.returncode == 0, loaded.stderr
    assert said in loaded.stdout, loaded.stdout
    status = kernelbridge("image", "status", KERNELBRIDGE_RUNTIME=loaded_by, **profile)
    assert (status.returncode, status.stdout) == (0, f"{minimal_tag}: current\n")
    archive.unlink()  # 462 MB: gone before the kernel's writeback would write them out to disk

    async with open_bridge(tmp_path / "bridge", KERNELBRIDGE_IMAGE_PROFILE="minimal") as bridge:
        found = await bridge.probe(
            "import importlib.util, numpy\n"
            "verdict = [numpy.__name__, importlib.util.find_spec('scipy') is None]",
            "minimal",
        )
        assert found == ["numpy", True]
        with anyio.fail_after(30):
            resource = await bridge.client.read_resource("kernelbridge://capabilities")
    manual = "\n".join(getattr(c, "text", "") for c in resource.contents)
    (line,) = [row for row in manual.splitlines() if "Python packages in the sandbox image" in row]
    assert "numpy==" in line and "pandas==" in line and "scipy" not in line, line


@pytest.mark.install
def test_setup_and_the_kernelspec_carry_the_minimal_profile(minimal_tag: str, tmp_path: Path) -> None:
    """`setup --profile minimal` uses (here: finds current) the minimal image, doctor checks that
    one, and the printed entry carries the profile; `kernelspec install` writes it too."""
    state = {"KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")}
    setup = kernelbridge("setup", "--profile", "minimal", **state)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-2000:]
    assert f"setup: sandbox image: {minimal_tag} (the minimal profile)" in setup.stdout
    assert f"ok    image      {minimal_tag} is current (ipykernel==" in setup.stdout
    entry = json.loads(setup.stdout[setup.stdout.index('{\n  "mcpServers"') :])["mcpServers"]["python"]
    assert entry["env"]["KERNELBRIDGE_IMAGE_PROFILE"] == "minimal"
    installed = kernelbridge(
        "kernelspec",
        "install",
        "--prefix",
        str(tmp_path / "prefix"),
        KERNELBRIDGE_IMAGE_PROFILE="minimal",
        **state,
    )
    assert installed.returncode == 0, installed.stderr
    spec = tmp_path / "prefix" / "share" / "jupyter" / "kernels" / "kernelbridge" / "kernel.json"
    assert json.loads(spec.read_text())["env"]["KERNELBRIDGE_IMAGE_PROFILE"] == "minimal"


# -- image files that are not this kernelbridge's sandbox image -------------------------------------------
def tiny_image_archive(work: Path, name: str, labels: dict[str, str]) -> Path:
    """A docker-archive, as `podman save` writes it, of an image imported from a one-file root
    file system with ``labels`` (the image is removed again: only the file is left)."""
    rootfs = work / f"{name}-rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"tiny\n"))
    tag = ARCHIVE_TAGS[name]
    changes = [f"--change=LABEL {key}={value}" for key, value in labels.items()]
    assert podman("import", *changes, str(rootfs), tag).returncode == 0
    archive = work / f"{name}.tar"
    try:
        saved = podman("save", "--format", "docker-archive", "-o", str(archive), tag)
        assert saved.returncode == 0, saved.stderr
    finally:
        podman("rmi", tag)
    return archive


@pytest.fixture(scope="module")
def foreign_archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The three files, made once for the module: each test only reads its own."""
    tmp_path = tmp_path_factory.mktemp("archives")
    old_agent = {image.HASH_LABEL: "0" * 64, image.IMAGE_HASH_LABEL: "0" * 64, image.VERSION_LABEL: "0.0.9"}
    archives = {
        "foreign": tiny_image_archive(tmp_path, "foreign", {"maintainer": "someone"}),
        "stale": tiny_image_archive(tmp_path, "stale", old_agent),
    }
    data = archives["stale"].read_bytes()
    with tarfile.open(archives["stale"]) as tar:
        layer = max((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.size)
    archives["truncated"] = tmp_path / "truncated.tar"
    archives["truncated"].write_bytes(data[: layer.offset_data + layer.size // 2])
    yield archives
    for ref in (*ARCHIVE_TAGS.values(), image.image_tag("0" * 64)):  # only if a refusal failed
        podman("rmi", ref)


ARCHIVE_TAGS = {
    "foreign": f"localhost/kbtest-{os.getpid()}:foreign",
    "stale": f"localhost/kbtest-{os.getpid()}:stale",
    "truncated": f"localhost/kbtest-{os.getpid()}:stale",
}
"""The tag each file's image had when it was saved (and removed)."""


REFUSALS = {
    "foreign": r"foreign\.tar is not a kernelbridge sandbox image \(.* no kernelbridge\.agent-hash label\);",
    "stale": r"stale\.tar holds the sandbox image of kernelbridge 0\.0\.9 \(000000000000\), stale for this",
    "truncated": r"truncated\.tar is not a whole image archive \(.*\): a truncated copy\?$",
}
"""What `image load` says of each file."""


@pytest.mark.parametrize("which", sorted(REFUSALS))
def test_load_refuses_what_is_not_this_kernelbridge_s_image(
    foreign_archives: dict[str, Path], which: str, tmp_path: Path
) -> None:
    """Refused in one line before the engine sees the file: nothing is loaded."""
    refused = kernelbridge(
        "image", "load", str(foreign_archives[which]), KERNELBRIDGE_STATE_DIR=str(tmp_path)
    )
    assert refused.returncode == 1
    assert re.match(f"kernelbridge: {REFUSALS[which]}", refused.stderr), refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and refused.stdout == ""
    for ref in (ARCHIVE_TAGS[which], image.image_tag("0" * 64)):
        assert podman("image", "exists", ref).returncode == 1, f"{ref} was loaded"
