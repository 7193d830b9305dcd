"""Faults during the adoption of a sandbox that outlived its bridge (issue 23), with real bridges,
real MCP clients and real podman sandboxes. Each test holds an adoption half-way (the sandbox's
agent stopped, so the new bridge's handover has connected and waits: ``durable_harness``) and
does something then:

- the container dies: the bridge says so in one line, nothing hangs, and the journal is intact
  (``restore=`` rebuilds the session from it);
- the adopting bridge is SIGKILLed, or its handover never speaks: the next bridge adopts the
  sandbox with its state;
- the state directory becomes read-only, or fills up: the adoption completes, the call says what
  could not be journalled in one line, no traceback, and what was journalled before is kept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from bridge_harness import fill, open_bridge, open_http_bridge, podman, serve_params, stop_process_tree
from durable_harness import (
    DURABLE,
    agent_pid,
    agent_stopped,
    handovers_of,
    remove_sandboxes_of,
    running,
    wait_for,
)
from test_outside import tmpfs
from waiting import hang_guard

from kernelbridge.host.container import HANDOVER_COMMAND, HANDOVER_ENV, HANDOVER_USER, HANDOVER_WORKDIR
from kernelbridge.notebook.journal import JournalCell
from kernelbridge.session.store import SessionStore
from kernelbridge.testing.notebooks import read_journal

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

BOUND = 60.0
"""Seconds any one call may take here (an adoption gives up after 15 s: host/owner.ADOPT_TIMEOUT)."""


@pytest.fixture
def state(tmp_path: Path, sandbox_image: str) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    yield state_dir
    remove_sandboxes_of(state_dir)


def cells_of(journal: Path) -> list[str]:
    """The code of the journal's cells, read as an export reads them (a torn line is skipped)."""
    return [entry.code for entry in read_journal(journal) if isinstance(entry, JournalCell)]


async def detached_session(state: Path) -> str:
    """A session ``s`` with ``x = 1``, left running by a bridge that exited; its container."""
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("x = 1\nprint(x)", "s")).status == "ok"
        container = await bridge.container("s")
    await wait_for(lambda: running(container), "the sandbox runs on")
    return container


async def test_a_container_that_dies_mid_handover_is_said_in_one_line(state: Path) -> None:
    container = await detached_session(state)
    journal = SessionStore(state).journal("s")
    before = journal.read_bytes()
    with agent_stopped(container) as agent:

        async def kill_mid_handover() -> None:
            await wait_for(lambda: handovers_of(agent), "the new bridge's handover connected")
            podman("kill", "-s", "KILL", container)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_mid_handover)
            with hang_guard(2 * BOUND, "the next bridge, its sandbox dead mid-handover"):
                async with open_bridge(state, **DURABLE) as bridge:
                    lost = await bridge.run("print('after')", "s")
                    assert "sandbox_lost" in lost.codes and "Traceback" not in lost.text, lost.text
                    (said,) = [n for n in lost.data["notes"] if "lost" in n or "could not" in n]
                    assert "\n" not in said and "exited" in said, said
                    assert journal.read_bytes().startswith(before)  # nothing of it lost
                    restore = lost.notes.split("restore='", 1)[1].split("'", 1)[0]
                    restored = await bridge.run("print(x)", "s", restore=restore)
                    assert restored.status == "ok" and restored.stdout == "1\n", restored.text
                    await bridge.close("s")


async def test_a_bridge_killed_mid_adoption_leaves_the_sandbox_to_the_next(state: Path) -> None:
    container = await detached_session(state)
    params = serve_params(state, **DURABLE)
    with agent_stopped(container) as agent:
        async with await anyio.open_process(
            [params.command, *params.args], env=params.env, stdin=subprocess.PIPE, stderr=None
        ) as killed:
            await wait_for(lambda: handovers_of(agent), "the new bridge's handover connected")
            stop_process_tree(killed.pid)
            with anyio.fail_after(BOUND):
                await killed.wait()
    # The agent goes on with a candidate whose bridge is dead: the next bridge must not wait on it
    # (were it refused while that candidate is pending, the session would not be adopted).
    with hang_guard(2 * BOUND, "the next bridge, beside a dead bridge's candidate"):
        async with open_bridge(state, **DURABLE) as bridge:
            kept = await bridge.run("print(x)", "s")
            assert kept.status == "ok" and kept.stdout == "1\n" and "adopted" in kept.codes, kept.text
            assert await bridge.container("s") == container
            await bridge.close("s")


async def test_a_silent_handover_does_not_keep_the_next_bridge_out(state: Path) -> None:
    """A dead bridge's exec session may stay open (the engine keeps its stdin): its handover is a
    candidate that never answers the challenge. The next bridge takes its place at once, instead
    of being refused (and losing the session) until that candidate's deadline."""
    container = await detached_session(state)
    async with await anyio.open_process(  # the handover of a bridge that never says its hello
        ["podman", "exec", "-i", "--user", HANDOVER_USER, "--workdir", HANDOVER_WORKDIR,
         *(f"--env={name}={value}" for name, value in HANDOVER_ENV), container, *HANDOVER_COMMAND],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    ) as silent:  # fmt: skip
        await wait_for(lambda: handovers_of(agent_pid(container)), "the silent handover connected")
        async with open_bridge(state, **DURABLE) as bridge:
            kept = await bridge.run("print(x)", "s")
            assert kept.status == "ok" and kept.stdout == "1\n" and "adopted" in kept.codes, kept.text
            assert await bridge.container("s") == container
            await bridge.close("s")
        assert silent.stdout is not None
        said = b""
        with anyio.fail_after(BOUND):
            async for chunk in silent.stdout:  # until the agent hangs up on it
                said += chunk
        assert b"another bridge came while this one was silent" in said


async def test_a_bridge_killed_right_after_its_adoption_leaves_the_sandbox_to_the_next(state: Path) -> None:
    container = await detached_session(state)
    async with open_bridge(state, **DURABLE) as bridge:
        adopted = await bridge.run("x += 1\nprint(x)", "s")
        assert adopted.stdout == "2\n" and "adopted" in adopted.codes, adopted.text
        stop_process_tree(bridge.pid)  # its attachment is an exec session now, not the container's stdin
    async with open_bridge(state, **DURABLE) as bridge:
        kept = await bridge.run("print(x)", "s")
        assert kept.status == "ok" and kept.stdout == "2\n" and "adopted" in kept.codes, kept.text
        assert await bridge.container("s") == container
        await bridge.close("s")


def make_fault(fault: str, mount: Path) -> None:
    """The state directory (``mount/state``) turns read-only, or its file system fills up. Read-only
    is a read-only bind of it over itself: what the bridge opens from now on is refused (a remount
    is refused while the bridge has files open for writing, as it always has)."""
    if fault == "read-only":
        state = str(mount / "state")
        subprocess.run(["mount", "--bind", state, state], check=True, timeout=30)
        subprocess.run(["mount", "-o", "remount,bind,ro", state], check=True, timeout=30)
    else:
        fill(mount / "filler")
        with open(mount / "filler", "ab", buffering=0) as filler:  # to the last byte
            for size in (4096, 1):
                with contextlib.suppress(OSError):
                    while filler.write(b"\0" * size):
                        pass


def mend(mount: Path) -> None:
    """Undo :func:`make_fault` (whichever it was, if any)."""
    state = mount / "state"
    if subprocess.run(["mountpoint", "-q", str(state)], check=False, timeout=30).returncode == 0:
        if subprocess.run(["umount", str(state)], check=False, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(state)], check=False, timeout=30)
    (mount / "filler").unlink(missing_ok=True)


@pytest.mark.parametrize("fault", ["read-only", "full"])
async def test_a_state_directory_that_fails_mid_adoption(
    tmp_path: Path, sandbox_image: str, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    # Over HTTP: its bridge stops on SIGTERM and must exit 0 (open_http_bridge checks), which a
    # stdio bridge slow to exit would not show (its client kills it after 2 s).
    tokens = {"t": "t" * 32}
    with tmpfs(tmp_path / "mnt", "size=64m") as mount:
        state, namespace = mount / "state", mount / "state" / "http" / "t"
        try:
            async with open_http_bridge(state, tokens, **DURABLE) as bridges:
                assert (await bridges["t"].run("x = 1\nprint(x)", "s")).status == "ok"
                container = await bridges["t"].container("s")
            journal = SessionStore(namespace).journal("s")
            before = journal.read_bytes()
            capfd.readouterr()
            with agent_stopped(container) as agent:

                async def fail_mid_adoption() -> None:
                    await wait_for(lambda: handovers_of(agent), "the new bridge's handover connected")
                    make_fault(fault, mount)
                    os.kill(agent, signal.SIGCONT)  # the adoption goes on with the disk failing

                async with (
                    anyio.create_task_group() as tg,
                    open_http_bridge(state, tokens, **DURABLE) as bridges,
                ):
                    tg.start_soon(fail_mid_adoption)
                    bridge = bridges["t"]
                    adopted = await bridge.run("print(x)", "s")
                    assert adopted.status == "ok" and adopted.stdout == "1\n", adopted.text
                    assert "adopted" in adopted.codes, adopted.text
                    # Bigger than what a full disk still takes into the journal's last page.
                    bigger = await bridge.run("x = 3  # " + "padding " * 2048, "s")
                    after = await bridge.run("print(x)", "s")
                    # A cell's failed write is said by the next call, once, in one line.
                    told = [r for r in (adopted, bigger, after) if "journal_failed" in r.codes]
                    assert len(told) == 1 and after.status == "ok", [
                        r.codes for r in (adopted, bigger, after)
                    ]
                    (said,) = [n for n in told[0].data["notes"] if "journal" in n]
                    assert "\n" not in said, said
                # ... and the bridge exited (status 0) with its state directory still failing.
            stderr = capfd.readouterr().err
            assert "Traceback" not in stderr, stderr
            mend(mount)
            assert journal.read_bytes().startswith(before)  # what was journalled before is kept
            async with open_http_bridge(state, tokens, **DURABLE) as bridges:
                again = await bridges["t"].run("print(x)", "s")
                assert again.stdout == "3\n" and "adopted" in again.codes, again.text
                await bridges["t"].close("s")
            cells = cells_of(journal)
            assert cells[0] == "x = 1\nprint(x)" and cells[-1] == "print(x)", cells
        finally:
            mend(mount)
            remove_sandboxes_of(state)
