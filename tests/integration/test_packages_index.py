"""``%pip install`` through real bridges and real sandboxes against a package index of the test's
own on 127.0.0.1 (``tests/package_index.py``), which counts every byte it serves: hostile
requirements never bring the bridge's environment back to the sandbox, the caps hold on what the
host downloads, and a bridge SIGKILLed in the middle of a download leaves nothing that a later
bridge trusts.

Every bridge here points its pip at that index (``PIP_INDEX_URL`` and no config file of this
machine: the setting these tests are about); caps are set small where they are what a test is
about, and say so.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import open_bridge, podman, stop_process_tree
from durable_harness import wait_for
from package_index import PackageIndex, build_wheel, disk_bytes, pip_settings

from kernelbridge.host.container import STATE_LABEL, state_identity

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

SECRET = "kb-test-secret-51d0e2"
SECRETS = {"KB_TEST_SECRET": SECRET, "KERNELBRIDGE_HTTP_TOKENS": f"alice:{SECRET}"}
"""In the bridge's environment, as an MCP client's keys or an HTTP bridge's tokens would be."""
MiB = 1024**2
STATE_PROBE = "x = 41\n"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("wheels")
    return {
        "demo": build_wheel(directory, "demo", "1.0"),
        "needs": build_wheel(directory, "needs-demo", "1.0", requires=["demo>=1"]),
        "one": build_wheel(directory, "one", "1.0", payload=1200 * 1024),
        "two": build_wheel(directory, "two", "1.0", payload=1200 * 1024),
        "mid": build_wheel(directory, "mid", "1.0", payload=4 * MiB),
        "big": build_wheel(directory, "big", "1.0", payload=24 * MiB),
    }


@pytest.fixture
async def index(wheels: dict[str, Path]) -> AsyncIterator[PackageIndex]:
    async with PackageIndex(wheels.values()).serving() as served:
        yield served


def one_line_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("UsageError: ")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


async def test_hostile_requirements_never_bring_the_bridges_environment_back(
    tmp_path: Path, sandbox_image: str, index: PackageIndex
) -> None:
    env = {**pip_settings(index), **SECRETS}
    async with open_bridge(tmp_path / "state", **env) as bridge:
        await bridge.run(STATE_PROBE, "s")
        cells = {
            "%pip install 'kb-nothing===${KB_TEST_SECRET}'": "arbitrary equality (===)",
            "%pip install 'demo===${KERNELBRIDGE_HTTP_TOKENS}'": "arbitrary equality (===)",
            "%pip install 'demo==1.0+evil.zip'": "cannot be passed on safely",
            "%pip install 'demo @ file:///etc/passwd'": "names a URL",
            "%pip install demo.zip": "no package demo.zip on the host's index",
            "runtime.pip_install('demo\\n--index-url http://127.0.0.1:9/simple')": "holds a line break",
        }
        for code, expected in cells.items():
            result = await bridge.run(code, "s", timeout=120)
            assert result.status == "error", result.text
            shown = one_line_error(result.text) if code.startswith("%pip") else result.text
            assert expected in shown, result.text
            assert SECRET not in result.text and SECRET not in str(result.data), result.text
        assert not index.saw(SECRET), "the index never saw the secret either"
        done = await bridge.run(
            "%pip install needs-demo\nimport needs_demo, demo\nprint(x + 1)", "s", timeout=120
        )
        assert done.status == "ok" and "42" in done.text, done.text
        assert "Successfully installed demo-1.0 needs-demo-1.0" in done.text, done.text


async def test_the_caps_bound_what_the_host_downloads(
    tmp_path: Path, sandbox_image: str, index: PackageIndex, wheels: dict[str, Path]
) -> None:
    # The caps are what this test is about: 2 MiB a session, 3 installs, the smallest cache (16 MiB).
    caps = {
        "KERNELBRIDGE_PACKAGES_MAX_BYTES": "2m",
        "KERNELBRIDGE_PACKAGES_MAX_INSTALLS": "3",
        "KERNELBRIDGE_PACKAGES_CACHE": "16m",
    }
    state = tmp_path / "state"
    peaks: list[int] = []
    index.on_chunk = lambda: peaks.append(disk_bytes(state / "packages"))
    async with open_bridge(state, **pip_settings(index), **caps) as bridge:
        await bridge.run(STATE_PROBE, "s")
        for name in ("big", "mid", "big"):
            refused = await bridge.run(f"%pip install {name}", "s", timeout=120)
            line = one_line_error(refused.text)
            assert "KERNELBRIDGE_PACKAGES_MAX_BYTES" in line and "nothing was installed" in line, line
        fourth = await bridge.run("%pip install demo", "s")
        assert "KERNELBRIDGE_PACKAGES_MAX_INSTALLS" in one_line_error(fourth.text), "refusals counted"
        assert index.fetched(wheels["big"].name) == index.fetched(wheels["mid"].name) == 0
        # Another session: one fits, the next would pass its cap and is refused before its download.
        first = await bridge.run("%pip install one", "t", timeout=120)
        assert first.status == "ok", first.text
        second = await bridge.run("%pip install two", "t", timeout=120)
        assert "may still install, 0.8 MiB of 2.0 MiB" in one_line_error(second.text), second.text
        assert index.fetched(wheels["two"].name) == 0
        assert index.fetched(wheels["one"].name) == wheels["one"].stat().st_size, "once, not twice"
        kept = await bridge.run("print('kept', x + 1)", "s")
        assert "kept 42" in kept.text
    assert peaks and max(peaks) <= 16 * MiB
    assert disk_bytes(state / "packages") <= 16 * MiB


def sandboxes_of(state_dir: Path) -> list[str]:
    return podman("ps", "-aq", "--filter", f"label={STATE_LABEL}={state_identity(state_dir)}").split()


@pytest.fixture
def durable_state(tmp_path: Path, sandbox_image: str) -> Iterator[Path]:
    """A state directory for bridges whose sessions outlive them (the product's default, which the
    suite turns off); its sandboxes are removed afterwards."""
    state_dir = tmp_path / "state"
    yield state_dir
    for attempt in range(2):
        left = sandboxes_of(state_dir)
        if left:
            podman("rm", "-f", "-t", "0", *left, timeout=120)
        if attempt == 0:
            time.sleep(1.0)


def _halves(packages: Path) -> list[Path]:
    """The wheel's downloads under way, each in a work directory of the cache."""
    return list((packages / "downloads").glob("dl-*/mid-1.0-py3-none-any.whl"))


async def test_a_bridge_killed_mid_download_leaves_nothing_half_trusted(
    durable_state: Path, index: PackageIndex, wheels: dict[str, Path]
) -> None:
    # Sessions outlive their bridge (KERNELBRIDGE_DURABLE=1 is the product's default).
    env = pip_settings(index)
    mid = wheels["mid"]
    packages = durable_state / "packages"
    hold = index.hold(mid.name)
    async with open_bridge(durable_state, **env) as bridge:
        await bridge.run(STATE_PROBE, "s")

        async def install() -> None:
            with pytest.raises(Exception):  # noqa: B017 - the bridge is killed under it
                await bridge.run("%pip install mid", "s", timeout=120)

        async with anyio.create_task_group() as tg:
            tg.start_soon(install)
            with anyio.fail_after(120):
                await hold.paused.wait()
            # The index has sent half the wheel; wait until the bridge has written some of it.
            await wait_for(
                lambda: any(half.stat().st_size > 0 for half in _halves(packages)),
                "the bridge writes the first half",
            )
            stop_process_tree(bridge.pid)  # SIGKILL, half-way through the wheel
    halves = _halves(packages)
    assert len(halves) == 1, "the half download is in a work directory of the cache (in its budget)"
    assert 0 < halves[0].stat().st_size < mid.stat().st_size
    assert not list((packages / "wheels").glob("*.whl")), "nothing entered the cache"
    hold.release.set()

    async with open_bridge(durable_state, **env) as bridge:
        first = await bridge.run("print('back')", "s")
        assert "adopted" in first.codes, first.text
        # The cell that ran the install finished while no bridge was there, and said so.
        assert "'%pip install mid', finished while no bridge was attached (error)" in first.notes
        assert "the bridge went away while this call was in flight" in first.notes
        assert first.notes.endswith("; nothing was installed"), first.notes
        listing = "sorted(n for n in os.listdir('/packages/site') if not n.startswith('.'))"
        after = await bridge.probe(f"import os\nverdict = [x, {listing}]", "s")
        assert after == [41, []], "the session is kept, and nothing of the install is in it"
        again = await bridge.run(
            "%pip install mid\nimport mid, os\nprint(os.path.getsize(mid.__path__[0] + '/payload.bin'))",
            "s",
            timeout=120,
        )
        assert again.status == "ok" and str(4 * MiB) in again.text, again.text
        assert not list((packages / "downloads").glob("dl-*")), "the dead bridge's download was removed"
        (cached,) = list((packages / "wheels").glob("*.whl"))
        assert cached.stem == hashlib.sha256(mid.read_bytes()).hexdigest()
        await bridge.close("s")
