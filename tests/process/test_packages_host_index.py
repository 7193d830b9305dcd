"""The package service with the host's real pip against a package index of the test's own on
127.0.0.1 (``tests/package_index.py``), no sandbox: what the sandbox sends never reaches pip as
sent, pip never has the bridge's secrets, and the host never fetches or keeps more bytes than the
caps allow, counted by the index itself and measured on the host's disk while it serves.

Each test names its caps (``KERNELBRIDGE_PACKAGES_MAX_BYTES``, ``_MAX_INSTALLS``, ``_CACHE``)
when they are what it is about: small caps and wheels of a few MiB keep it fast. The pip
environment is the test's (``env=``): this machine's pip configuration (its mirror, find-links)
is replaced by the local index (:func:`package_index.pip_settings`), the one setting every test
here is about.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from package_index import PackageIndex, build_wheel, disk_bytes, pip_settings

from kernelbridge.calls import RpcCall
from kernelbridge.config import PackageSettings, load_settings
from kernelbridge.errors import RpcError
from kernelbridge.packages import PackageService
from kernelbridge.packages.cache import WheelCache
from kernelbridge.packages.pip import Resolved

pytestmark = pytest.mark.anyio

SECRET = "kb-test-secret-7f3a9c"
SECRETS = {
    "KB_TEST_SECRET": SECRET,
    "KERNELBRIDGE_HTTP_TOKENS": f"alice:{SECRET}",
    "ANTHROPIC_API_KEY": SECRET,
}
"""What a bridge's environment holds besides pip's configuration: tokens, the MCP client's keys."""
MiB = 1024**2


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """demo (small, depends on nothing), three of 1.2 MiB, and big ones that no cap here admits."""
    directory = tmp_path_factory.mktemp("wheels")
    built = {
        "demo": build_wheel(directory, "demo", "1.0"),
        "needs": build_wheel(directory, "needs-demo", "1.0", requires=["demo>=1"]),
        "big": build_wheel(directory, "big", "1.0", payload=24 * MiB),
        "liar": build_wheel(directory, "liar", "1.0", payload=24 * MiB),
        "mid": build_wheel(directory, "mid", "1.0", payload=4 * MiB),
    }
    for name in ("one", "two", "three"):
        built[name] = build_wheel(directory, name, "1.0", payload=1200 * 1024)
    return built


@pytest.fixture
async def index(wheels: dict[str, Path]) -> AsyncIterator[PackageIndex]:
    async with PackageIndex(wheels.values()).serving() as served:
        yield served


@dataclasses.dataclass
class Host:
    """A package service as a bridge has it, its state directory and its pip's home."""

    service: PackageService
    state: Path
    home: Path

    async def install(self, *requirements: str, sandbox: str = "c1", **params: Any) -> Any:
        body = {"requirements": list(requirements), "environment": [], **params}
        return await self.service.dispatch(
            RpcCall("s", frozenset(), "packages_install", body, sandbox=sandbox)
        )

    async def done(self, plan: str, sandbox: str = "c1") -> Any:
        params = {"plan": plan, "ok": True}
        return await self.service.dispatch(
            RpcCall("s", frozenset(), "packages_done", params, sandbox=sandbox)
        )

    async def refused(self, *requirements: str, **params: Any) -> RpcError:
        with pytest.raises(RpcError) as caught:
            await self.install(*requirements, **params)
        return caught.value


def host(tmp_path: Path, index: PackageIndex, **caps: Any) -> Host:
    state, home = tmp_path / "state", tmp_path / "home"
    home.mkdir()
    settings = load_settings({"KERNELBRIDGE_STATE_DIR": str(state)})
    settings = dataclasses.replace(settings, packages=PackageSettings(**caps))
    # The bridge's environment: the machine's PATH, a home of the test's (pip's caches and
    # configuration would go there), the local index, and secrets pip must never see.
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env.update(pip_settings(index), **SECRETS)
    return Host(PackageService(settings, env=env), state, home)


HOSTILE = [
    # pip expands ${VAR} in a requirements file from its environment: the bridge's secrets.
    ("demo===${KB_TEST_SECRET}", "arbitrary equality"),
    ("kb-nothing===${KB_TEST_SECRET}", "arbitrary equality"),
    ("demo===${KERNELBRIDGE_HTTP_TOKENS}", "arbitrary equality"),
    # pip reads a requirement that ends like an archive as a file of its working directory.
    ("demo==1.0+evil.zip", "cannot be passed on safely"),
    ("demo==1.0+x.whl", "cannot be passed on safely"),
    # Options, in every place pip takes one.
    ("demo\n--index-url http://127.0.0.1:9/simple", "line break"),
    ("demo\r-i http://127.0.0.1:9/simple", "line break"),
    ("demo --index-url=http://127.0.0.1:9/simple", "options, URLs, paths"),
    ("--extra-index-url=http://127.0.0.1:9/simple", "is an option"),
    ("-r /etc/passwd", "is an option"),
    ("--trusted-host=evil.example", "is an option"),
    # URLs and paths, host files and networks.
    ("demo @ file:///etc/passwd", "names a URL"),
    ("demo @ http://127.0.0.1:9/demo-1.0-py3-none-any.whl", "names a URL"),
    ("./demo-1.0-py3-none-any.whl", "a URL or a path"),
    ("demo; python_version > '3' --index-url x", "options, URLs, paths"),
]


@pytest.mark.parametrize(("line", "why"), HOSTILE)
async def test_a_hostile_requirement_is_refused_quoting_its_own_text(
    tmp_path: Path, index: PackageIndex, line: str, why: str
) -> None:
    refused = await host(tmp_path, index).refused(line)
    assert refused.kind == "invalid_params" and why in refused.message, refused.message
    assert SECRET not in refused.message and "\n" not in refused.message
    assert repr(line.strip()[:80]) in refused.message, "the message quotes what the sandbox sent"
    assert not index.saw(SECRET) and not index.requests, "nothing reached the index"


async def test_names_pip_would_take_for_files_are_passed_normalized(
    tmp_path: Path, index: PackageIndex
) -> None:
    # `demo.zip` and `Demo_Pkg.whl` are valid project names; as sent, pip would read them as
    # archives of its working directory (a host file, even an sdist it would build).
    refused = await host(tmp_path, index).refused("demo.zip")
    assert refused.kind == "package_error" and refused.message.startswith(
        "no package demo.zip on the host's index"
    )
    assert any(line.startswith("GET /simple/demo-zip/") for line in index.requests), index.requests


async def test_the_sandboxs_environment_and_a_notebooks_record_are_rendered_too(
    tmp_path: Path, index: PackageIndex
) -> None:
    bridge = host(tmp_path, index)
    for environment in (["demo==1.0+${KB_TEST_SECRET}"], ["demo==1.0+evil.zip"], ["--index-url==1.0"]):
        refused = await bridge.refused("needs-demo", environment=environment)
        assert refused.kind == "invalid_params" and SECRET not in refused.message
    record = {"requirements": ["demo"], "ok": True, "installed": [
        {"name": "demo", "version": "${KB_TEST_SECRET}", "filename": "demo-1.0-py3-none-any.whl",
         "sha256": "ab" * 32, "size": 1, "installed_size": 1}]}  # fmt: skip
    from kernelbridge.packages.record import records_of

    bridge.service.prefer("", "s", records_of([record]))
    refused = await bridge.refused("demo")
    assert refused.kind == "invalid_params" and SECRET not in refused.message
    assert not index.saw(SECRET)


async def test_a_restore_fetches_the_recorded_wheels_the_cache_lost(
    tmp_path: Path, index: PackageIndex, wheels: dict[str, Path]
) -> None:
    import hashlib

    from kernelbridge.packages.record import records_of

    demo = wheels["demo"]
    sha = hashlib.sha256(demo.read_bytes()).hexdigest()
    wheel = {"name": "Demo", "version": "1.0", "filename": demo.name, "sha256": sha,
             "size": demo.stat().st_size, "installed_size": 1}  # fmt: skip
    bridge = host(tmp_path, index)
    bridge.service.prefer(
        "", "s", records_of([{"requirements": ["Demo>=1"], "ok": True, "installed": [wheel]}])
    )
    plan = await bridge.install("demo>=1")
    assert plan["source"] == "recorded" and [w["sha256"] for w in plan["install"]] == [wheel["sha256"]]
    assert index.fetched(demo.name) == demo.stat().st_size
    forged = {**wheel, "filename": "demo-1.0-py3-none-manylinux1_x86_64.whl", "sha256": "cd" * 32}
    (tmp_path / "other").mkdir()
    other = host(tmp_path / "other", index)
    other.service.prefer("", "s", records_of([{"requirements": ["demo"], "ok": True, "installed": [forged]}]))
    refused = await other.refused("demo")
    assert refused.kind == "package_error" and "no longer serves" in refused.message, refused.message


def pip_environments(parent: int) -> list[bytes]:
    """The environments of the host's pip processes that ``parent`` runs now."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
                continue
            cmdline = (entry / "cmdline").read_bytes()
            if b"pip" in cmdline:
                found.append((entry / "environ").read_bytes())
        except (OSError, ValueError, IndexError):
            continue
    return found


async def test_pip_runs_without_the_bridges_secrets(tmp_path: Path, index: PackageIndex) -> None:
    seen: list[bytes] = []
    # While pip waits for this page, its process is there to look at.
    index.on_page = lambda: seen.extend(pip_environments(os.getpid()))
    plan = await host(tmp_path, index).install("needs-demo")
    assert sorted(w["name"] for w in plan["install"]) == ["demo", "needs-demo"]
    assert seen, "the index saw the host's pip while it ran"
    for environ in seen:
        variables = dict(item.split(b"=", 1) for item in environ.split(b"\0") if b"=" in item)
        assert SECRET.encode() not in environ, sorted(variables)
        assert b"KERNELBRIDGE_HTTP_TOKENS" not in variables and b"PIP_INDEX_URL" in variables
        assert variables[b"TMPDIR"].startswith(str(tmp_path / "state").encode()), "pip works in the cache"


async def test_a_wheel_over_what_the_session_may_install_is_not_downloaded(
    tmp_path: Path, index: PackageIndex, wheels: dict[str, Path]
) -> None:
    # KERNELBRIDGE_PACKAGES_MAX_BYTES is what this test is about: 2 MiB, the big wheel is 24 MiB.
    bridge = host(tmp_path, index, max_bytes=2 * MiB)
    refused = await bridge.refused("big")
    assert refused.kind == "too_large" and "KERNELBRIDGE_PACKAGES_MAX_BYTES" in refused.message, (
        refused.message
    )
    assert "big 1.0's wheel is 24.0 MiB" in refused.message
    assert index.fetched(wheels["big"].name) == 0, "refused on the index's word, before its first byte"
    # An index that declares a small size and sends more: the host stops at the declared size.
    index.lie[wheels["liar"].name] = 100 * 1024
    index.rate = 8 * MiB  # what the buffers between the index and pip hold stays well under 8 MiB
    refused = await bridge.refused("liar")
    assert refused.kind == "too_large" and "liar 1.0's wheel is more than 0.1 MiB" in refused.message
    assert index.fetched(wheels["liar"].name) < 8 * MiB, "a few socket buffers past 100 KiB, not 24 MiB"
    assert not list((bridge.state / "packages" / "downloads").glob("dl-*")), "no download left behind"


async def test_an_index_without_metadata_files_is_bounded_too(
    tmp_path: Path, wheels: dict[str, Path]
) -> None:
    # Without PEP 658 metadata, pip downloads a wheel to read its dependencies: that download is
    # bounded by what the session may still install (KERNELBRIDGE_PACKAGES_MAX_BYTES, 2 MiB).
    async with PackageIndex(wheels.values(), metadata=False).serving() as old:
        old.rate = 8 * MiB  # what the buffers between the index and pip hold stays well under 8 MiB
        bridge = host(tmp_path, old, max_bytes=2 * MiB)
        refused = await bridge.refused("big")
        assert refused.kind == "too_large" and "PEP 658" in refused.message, refused.message
        assert old.fetched(wheels["big"].name) < 8 * MiB, "2 MiB and socket buffers, not 24 MiB (twice)"
        plan = await bridge.install("needs-demo")  # small ones still resolve and install
        assert sorted(w["name"] for w in plan["install"]) == ["demo", "needs-demo"]


async def test_refused_installs_count_against_the_installs_cap(tmp_path: Path, index: PackageIndex) -> None:
    # KERNELBRIDGE_PACKAGES_MAX_INSTALLS (2) and _MAX_BYTES (2 MiB) are what this test is about.
    bridge = host(tmp_path, index, max_bytes=2 * MiB, max_installs=2)
    assert (await bridge.refused("big")).kind == "too_large"
    assert (await bridge.refused("kb-no-such-package")).kind == "package_error"
    third = await bridge.refused("demo")
    assert third.kind == "denied" and "KERNELBRIDGE_PACKAGES_MAX_INSTALLS" in third.message
    assert not any("/simple/demo/" in line for line in index.requests), "the third asked the index nothing"


async def test_every_byte_on_the_host_stays_inside_the_cache_budget(
    tmp_path: Path, index: PackageIndex, wheels: dict[str, Path]
) -> None:
    # KERNELBRIDGE_PACKAGES_CACHE (3 MiB, three wheels of 1.2 MiB) is what this test is about.
    bridge = host(tmp_path, index, cache_bytes=3 * MiB)
    peaks: list[int] = []
    index.on_chunk = lambda: peaks.append(disk_bytes(bridge.state) + disk_bytes(bridge.home / ".cache"))
    for name in ("one", "two", "three", "one"):
        plan = await bridge.install(name, sandbox=name)
        await bridge.done(plan["plan"], sandbox=name)
    assert peaks and max(peaks) <= 3 * MiB, f"the host held {max(peaks) / MiB:.1f} MiB"
    assert disk_bytes(bridge.state / "packages") <= 3 * MiB
    # pip kept nothing of its own (no HTTP cache; rustup writes its settings when pip asks rustc
    # its version for the User-Agent).
    assert not [path for path in bridge.home.rglob("*") if "pip" in path.name], list(bridge.home.rglob("*"))
    assert index.fetched(wheels["one"].name) == 2 * wheels["one"].stat().st_size, "pruned, fetched again"
    refused = await bridge.refused("mid")  # 4 MiB: more than the whole cache
    assert refused.kind == "too_large" and "KERNELBRIDGE_PACKAGES_CACHE" in refused.message, refused.message
    assert index.fetched(wheels["mid"].name) == 0
    assert max(peaks) <= 3 * MiB


async def test_a_small_install_prunes_nothing_it_does_not_need(
    tmp_path: Path, index: PackageIndex, wheels: dict[str, Path]
) -> None:
    # KERNELBRIDGE_PACKAGES_CACHE (4 MiB) is what this test is about: smaller than what a session
    # may install (128 MiB, the default), which must not make every install empty the cache.
    bridge = host(tmp_path, index, cache_bytes=4 * MiB)
    for name in ("one", "two", "demo"):
        plan = await bridge.install(name, sandbox=name)
        await bridge.done(plan["plan"], sandbox=name)
    kept = sorted(path.name for path in (bridge.state / "packages" / "wheels").glob("*.whl"))
    assert len(kept) == 3, "one, two and demo fit: none was pruned for room nobody needed"


def test_the_hosts_pip_ends_with_its_bridge(tmp_path: Path) -> None:
    # A bridge whose pip is connected to an index that never answers (pip would wait 15 s, then
    # retry), killed then: its pip must end with it, not run on into the next bridge's cache.
    script = textwrap.dedent(f"""
        import anyio, os, socket
        from pathlib import Path
        from kernelbridge.packages import pip
        index = socket.socket()
        index.bind(("127.0.0.1", 0))
        index.listen(8)
        env = pip.pip_env({{"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": "/dev/null",
                            "PIP_INDEX_URL": f"http://127.0.0.1:{{index.getsockname()[1]}}/simple"}})

        async def main():
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: pip.run_pip(["install", "--dry-run", "--", "demo"],
                                                  Path({str(tmp_path)!r}), limit=2**20, timeout=60, env=env))
                await anyio.wait_readable(index)
                held = index.accept()
                print("asked", flush=True)

        anyio.run(main)
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as bridge:
        try:
            assert bridge.stdout is not None and bridge.stdout.readline() == "asked\n"
            (orphan,) = pip_processes(bridge.pid)
        finally:
            bridge.send_signal(signal.SIGKILL)
    # With PR_SET_PDEATHSIG it is gone at once; an orphan would wait out its socket timeout (15 s).
    deadline = time.monotonic() + 3
    while _state(orphan) != "Z":
        assert time.monotonic() < deadline, "pip ran on after its bridge was killed"
        time.sleep(0.05)


def pip_processes(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                if b"pip" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _state(pid: int) -> str:
    """A process's state letter; ``Z`` for one that is gone too."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_what_a_killed_bridge_left_in_the_cache_is_not_trusted(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "cache", max_bytes=64 * MiB)
    # A process that claims a work directory, writes half a download into it, and is SIGKILLed.
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from kernelbridge.packages.cache import WheelCache
        work = WheelCache(Path({str(cache.root)!r}), {64 * MiB}).claim(8 * {MiB})
        (work.path / "big-1.0-py3-none-any.whl").write_bytes(b"x" * {MiB})
        print(work.path, flush=True)
        time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        work = Path(child.stdout.readline().strip())
        assert cache.footprint() >= 8 * MiB, "a live download counts at what it reserved"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert work.exists()
    assert cache.footprint() < MiB, "a dead owner's reservation is not counted"
    assert not work.exists(), "and its directory is removed"
    # A wheel cut short after its record was written (the rename of a half file): never used.
    good = build_wheel(tmp_path, "demo", "1.0")
    import hashlib

    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    added = cache.add(good, Resolved("demo", "1.0", good.name, "", sha, True))
    assert cache.get(sha) == added
    cut = cache.path(sha)
    cut.write_bytes(cut.read_bytes()[:100])
    assert cache.get(sha) is None, "a wheel whose size is not its record's is not trusted"


@pytest.mark.parametrize("moment", ["resolving", "downloading"])
async def test_a_cancelled_install_leaves_no_work_directory_and_no_pip(
    tmp_path: Path, index: PackageIndex, wheels: dict[str, Path], moment: str
) -> None:
    # A cell's timeout cancels its install mid-way: while pip resolves (it waits for the index's
    # page), or while a wheel comes down (held half-way by the index). The work directory and
    # its reservation go at once (the next install in this bridge would count them), pip with it.
    import anyio

    bridge = host(tmp_path, index)
    asked, hold = anyio.Event(), index.hold(wheels["one"].name)
    if moment == "resolving":
        index.on_page = asked.set
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(bridge.install, "one")
            await (asked.wait() if moment == "resolving" else hold.paused.wait())
            assert list((bridge.state / "packages" / "downloads").glob("dl-*")), "the install is working"
            tg.cancel_scope.cancel()
    hold.release.set()
    assert not list((bridge.state / "packages" / "downloads").glob("dl-*")), "a work directory was left"
    assert not pip_processes(os.getpid()), "pip ran on"
    index.on_page = None
    plan = await bridge.install("one")  # the session may install again: nothing is held
    assert [w["name"] for w in plan["install"]] == ["one"]
