"""What the tests of sandboxes that outlive their bridge share: their bridges' settings, the
sandboxes of a state directory, and a hold on an adoption half-way.

A test runs real bridges one after another on one state directory (``bridge_harness``), with
:data:`DURABLE`; a bridge that exits lets go of its sandboxes, and the next adopts them. To act
*during* an adoption (kill the container, the bridge, fill the disk) a test stops the sandbox's
agent first (:func:`agent_stopped`): the adopting bridge's handover then connects and waits for
an agent that does not answer, visible on the host (:func:`handovers_of`), until the test lets
the agent go on. Every wait is on a condition with a bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
from bridge_harness import podman

from kernelbridge.host.container import HANDOVER_COMMAND, STATE_LABEL, state_identity
from kernelbridge.session.store import SessionStore

DURABLE: dict[str, str] = {}
"""Sessions outlive their bridge with every setting at its default."""
WAIT = 60.0
HANDOVER_SCRIPT = HANDOVER_COMMAND[-1]


def sandboxes_of(state_dir: Path, *, every: bool = True) -> list[str]:
    """Containers labelled with ``state_dir``'s identity (running ones only unless ``every``)."""
    args = ["ps", "-q", "--filter", f"label={STATE_LABEL}={state_identity(state_dir)}"]
    return podman(*([*args, "-a"] if every else args)).split()


def running(*containers: str) -> bool:
    """Whether every one of ``containers`` (names) runs. A bridge's warm sandbox may outlive it
    too (if it was ready when the bridge left): count the session's own, not the state's."""
    return set(containers) <= set(podman("ps", "--format", "{{.Names}}").split())


def remove_sandboxes_of(state_dir: Path) -> None:
    """Remove every sandbox of ``state_dir`` and of its HTTP namespaces (a create in flight at the
    engine when its bridge exited appears a moment later: looked for twice)."""
    namespaces = [state_dir, *sorted((state_dir / "http").glob("*"))]
    for attempt in range(2):
        left = [name for namespace in namespaces for name in sandboxes_of(namespace)]
        if left:
            podman("rm", "-f", "-t", "0", *left, timeout=120)
        if attempt == 0:
            time.sleep(1.0)


async def wait_for(condition: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` (an engine or /proc query: nothing to wait on) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await anyio.sleep(0.1)


def workspace_files(container: str) -> list[str]:
    """The names in ``container``'s /workspace (a cell that writes a file says how far it got)."""
    return podman("exec", container, "ls", "/workspace").split()


def pool_filled(state_dir: Path) -> bool:
    """A warm sandbox of ``state_dir``'s pool is ready: the pool wrote its record."""
    return bool(SessionStore(state_dir).warm_records())


def agent_pid(container: str) -> int:
    """The host pid of ``container``'s PID 1 (the agent)."""
    pid = int(podman("inspect", "--format", "{{.State.Pid}}", container).strip() or 0)
    assert pid > 0, f"{container} does not run"
    return pid


def handovers_of(pid: int) -> list[int]:
    """Host pids of handover processes in the pid namespace of process ``pid`` (the agent)."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            same = os.readlink(entry / "ns" / "pid") == namespace
        except OSError:
            continue
        if same and HANDOVER_SCRIPT.encode() in argv:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def agent_stopped(container: str) -> Iterator[int]:
    """``container``'s agent stopped (SIGSTOP) while inside, so an adoption waits half-way; it goes
    on (SIGCONT) when the block ends, if it is still there. Yields the agent's host pid."""
    pid = agent_pid(container)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def secret_file(state_dir: Path, session: str) -> Path:
    """The file of ``session``'s current record that holds its sandbox's adoption secret."""
    stored = SessionStore(state_dir).current(session)
    assert stored is not None and stored.secret is not None
    return SessionStore(state_dir).session_dir(session) / stored.secret


def forge_secret(state_dir: Path, session: str) -> None:
    """Replace ``session``'s secret with a well-formed one that is not its sandbox's."""
    path = secret_file(state_dir, session)
    path.unlink()
    path.write_text("ab" * 32)
    path.chmod(0o600)
