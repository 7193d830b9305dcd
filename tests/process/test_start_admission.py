"""Cold starts take turns (kernelbridge/host/admission.py): a few at once, first come first served,
shared with other processes through the slot files, the wait bounded and said; and a start's own
bound runs from its turn (the warm pool, with a starter that models a CPU-bound start)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from kernelbridge.errors import SandboxStartTimeout
from kernelbridge.host.admission import StartAdmission
from kernelbridge.host.warm_pool import WarmPool

pytestmark = pytest.mark.anyio

HOLD_BOTH = """
import fcntl, os, sys
fds = [os.open(os.path.join(sys.argv[1], f"slot-{i}"), os.O_RDWR | os.O_CREAT, 0o600) for i in range(2)]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
sys.stdout.write("held\\n")
sys.stdout.flush()
sys.stdin.read()
"""
"""Another process that holds both slots of a 2-slot directory until its stdin closes."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Crowd:
    """Counts how many are inside at once."""

    def __init__(self) -> None:
        self.now = self.most = 0

    def enter(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def leave(self) -> None:
        self.now -= 1


async def test_starts_take_turns_a_few_at_a_time(tmp_path: Path) -> None:
    admission = StartAdmission(tmp_path / "slots", slots=2)
    crowd = Crowd()

    async def start(n: int) -> None:
        async with admission.turn(f"s{n}"):
            crowd.enter()
            await anyio.sleep(0.02)
            crowd.leave()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for n in range(6):
                tg.start_soon(start, n)
    assert crowd.most == 2 and crowd.now == 0


async def test_turns_are_first_come_first_served_within_a_process(tmp_path: Path) -> None:
    admission = StartAdmission(tmp_path / "slots", slots=1)
    order: list[int] = []

    async def start(n: int) -> None:
        async with admission.turn(f"s{n}"):
            order.append(n)
            await anyio.sleep(0.01)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(start, n)
                await anyio.sleep(0.005)  # they arrive in this order
    assert order == [0, 1, 2, 3, 4]


async def test_turns_are_shared_with_other_processes_and_the_wait_is_bounded(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    other = await anyio.open_process([sys.executable, "-c", HOLD_BOTH, str(slots)], stdin=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdin is not None
        with anyio.fail_after(30):
            assert await other.stdout.receive() == b"held\n"
        impatient = StartAdmission(slots, slots=2, queue_timeout=0.5)
        with pytest.raises(SandboxStartTimeout, match=r"did not get its turn to start within 0\.5 s"):
            async with impatient.turn("late"):
                pytest.fail("a turn while another process holds every slot")
        patient = StartAdmission(slots, slots=2, queue_timeout=30)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def let_go() -> None:
                    await anyio.sleep(0.3)
                    await other.stdin.aclose()  # type: ignore[union-attr]

                tg.start_soon(let_go)
                async with patient.turn("after") as waited:
                    assert waited >= 0.2, waited  # it waited for the other process
    finally:
        with contextlib.suppress(ProcessLookupError):  # it ends once its stdin closed
            other.kill()
        await other.wait()


async def test_a_directory_of_another_user_keeps_turns_within_the_process(tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # not private: another user could hold or swap the slots
    admission = StartAdmission(shared / "slots", slots=1)
    crowd = Crowd()

    async def start() -> None:
        async with admission.turn("s"):
            crowd.enter()
            await anyio.sleep(0.02)
            crowd.leave()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(start)
    assert crowd.most == 1 and not (shared / "slots" / "slot-0").exists()


@dataclass
class Started:
    name: str

    @property
    def sandbox(self) -> object:
        return self


WORK = 10
"""Ticks of CPU a start needs alone; shared by all that run at once (a CPU-bound start)."""
TICK = 0.01
BOUND = 0.5
"""A start's own bound (the owner's start timeout): 2 at once take ~0.2 s, 8 at once ~0.8 s."""


async def test_a_start_bound_runs_from_its_turn(tmp_path: Path) -> None:
    crowd = Crowd()

    async def cpu_bound_start(name: str) -> Started:
        with anyio.fail_after(BOUND):
            crowd.enter()
            try:
                done = 0.0
                while done < WORK:
                    await anyio.sleep(TICK)
                    done += 1 / crowd.now
            finally:
                crowd.leave()
        return Started(name)

    pool: WarmPool[Started] = WarmPool(
        0, cpu_bound_start, start_timeout=BOUND, admission=StartAdmission(tmp_path / "slots", slots=2)
    )
    started: list[str] = []

    async def session(n: int) -> None:
        started.append((await pool.take(f"s{n}")).name)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(session, n)
    assert sorted(started) == [f"s{n}" for n in range(8)] and crowd.most == 2


async def test_a_start_that_never_answers_is_a_start_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pod bound to a node that died: the engine accepts the start and never says more. The
    # agent must get the project's one-line error, not a bare TimeoutError from the bound.
    # (The bound's 15 s margin for a start's own clean-up, shortened: it is not what this tests.)
    monkeypatch.setattr("kernelbridge.host.warm_pool.SHUTDOWN_TIMEOUT", 0.1)

    async def start_that_hangs(name: str) -> Started:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    pool: WarmPool[Started] = WarmPool(
        0, start_that_hangs, start_timeout=0.1, admission=StartAdmission(tmp_path / "slots", slots=2)
    )
    with anyio.fail_after(30), pytest.raises(SandboxStartTimeout, match="no sandbox started within"):
        await pool.take("s")
