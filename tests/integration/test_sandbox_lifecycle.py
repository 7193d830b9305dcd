"""Sandbox lifecycle around the kernel: stale agents refused, orphans reaped, doctor's verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernelbridge.config import Settings, load_settings
from kernelbridge.errors import AgentMismatch
from kernelbridge.jupyter import SandboxKernelManager
from kernelbridge.runtime import ContainerSpec, cli_runtime, reap_orphans

pytestmark = pytest.mark.podman


@pytest.fixture
def settings(tmp_path: Path, sandbox_image: str) -> Settings:
    return load_settings({"KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)})


@pytest.mark.anyio
async def test_a_stale_agent_is_refused_with_a_clear_message(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernelbridge.jupyter.provisioner
    from kernelbridge.image import default_image

    real_image = default_image()
    # A host whose own agent differs from the one baked into the image.
    monkeypatch.setattr(kernelbridge.jupyter.provisioner, "expected_image", lambda _: (real_image, "f" * 64))
    km = SandboxKernelManager(settings=settings, session_name="stale")
    with pytest.raises(AgentMismatch, match="rebuild it with `kernelbridge image build`"):
        await km.start_kernel()


def dead_pid() -> int:
    """A pid that certainly belonged to a process which has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


ORPHAN_ATTEMPTS = 5


@pytest.mark.anyio
async def test_containers_of_a_dead_bridge_are_reaped_and_live_ones_kept(settings: Settings) -> None:
    image = kernelbridge_image(settings)
    orphan_name = f"kernelbridge-reap-orphan-{os.getpid()}"
    mine_name = f"kernelbridge-reap-mine-{os.getpid()}"
    async with cli_runtime(settings) as runtime:

        async def reap_containers() -> set[str]:
            return {c.name for c in await runtime.list({"kernelbridge.session": "reap"})}

        async def create(name: str, owner: int) -> None:
            spec = ContainerSpec(
                image=image, name=name, session="reap", owner_pid=owner, command=("sleep", "120")
            )
            await runtime.create(spec)

        try:
            with anyio.fail_after(60):
                await create(mine_name, os.getpid())
                # Every bridge that starts on this engine reaps a dead bridge's containers too (one
                # of another test's, say): an orphan gone before this test's reaper ran was reaped
                # all the same. It is made again until the listing shows both.
                for _ in range(ORPHAN_ATTEMPTS):
                    await create(orphan_name, dead_pid())
                    if await reap_containers() == {mine_name, orphan_name}:
                        break
                else:
                    pytest.fail(
                        f"the orphan was reaped by others {ORPHAN_ATTEMPTS} times before it was listed"
                    )
                await reap_orphans(runtime)
                assert await reap_containers() == {mine_name}
        finally:
            await runtime.remove([orphan_name, mine_name])


def kernelbridge_image(settings: Settings) -> str:
    from kernelbridge.image import default_image

    return settings.image or default_image()


def doctor(settings: Settings, **env: str) -> tuple[int, list[list[str]]]:
    """Run `kernelbridge doctor`; its exit status and the first two words of each line."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("kernelbridge")), "doctor"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(settings.state_dir), **env},
        check=False,
    )
    return result.returncode, [line.split()[:2] for line in result.stdout.splitlines()]


def test_doctor_passes_every_check(settings: Settings) -> None:
    status, lines = doctor(settings)
    assert lines[:7] == [
        ["ok", "settings"],
        ["ok", "state"],
        ["ok", "runtime"],
        ["ok", "durable"],
        ["ok", "image"],
        ["ok", "limits"],
        ["ok", "kernel"],
    ]
    assert lines[7][1] == "hub"  # host MCP config: ok, or warn for a bad file
    assert lines[8][1] == "summary" and len(lines) == 9
    assert lines[8][0] in ("ok", "warn")
    assert status == 0


def test_doctor_fails_with_one_line_per_check_when_the_image_is_missing(settings: Settings) -> None:
    status, lines = doctor(settings, KERNELBRIDGE_IMAGE="localhost/kernelbridge-sandbox:nope")
    expected = [["ok", "settings"], ["ok", "state"], ["ok", "runtime"], ["ok", "durable"], ["FAIL", "image"]]
    assert lines[:7] == [*expected, ["skip", "limits"], ["skip", "kernel"]]
    assert lines[7][1] == "hub"
    assert lines[8] == ["FAIL", "summary"] and len(lines) == 9
    assert status == 1


@pytest.mark.anyio
@pytest.mark.parametrize("after", [0.05, 0.3, 0.6])
async def test_cancelling_a_start_leaves_no_container(settings: Settings, after: float) -> None:
    session = f"cancel{int(after * 100)}"
    km = SandboxKernelManager(settings=settings, session_name=session)
    with anyio.move_on_after(after) as scope:
        await km.start_kernel()
    if not scope.cancelled_caught:  # started before the deadline: an ordinary shutdown
        await km.shutdown_kernel(now=True)
    async with cli_runtime(settings) as runtime:
        with anyio.fail_after(30):
            while await runtime.list({"kernelbridge.session": session}):  # noqa: ASYNC110
                await anyio.sleep(0.2)  # the runtime has no "removed" event to wait for
