"""Sessions whose sandbox outlived its bridge, on the registry's side: checked, inherited, said.

A record is only a claim: before a bridge trusts a sandbox, the engine must say it is running and
labelled for this state directory, namespace and session (:func:`check_container`), and the sandbox
must prove it knows the secret (``tunnel/durable.py``). Anything short of that is a :class:`Loss`:
the generation ends ``lost``, a container of ours nobody can use is removed (never another's), and
the next call says so (:class:`~.outcome.SandboxLost`, with ``restore=``). :func:`adopted_note` is
built when the session's first call ends, so an inherited cell is reported as it ended.
No I/O of its own but the engine's ``inspect``/``ended``/``remove`` and the journal's line count.

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from kernelbridge.errors import RuntimeUnavailable, SandboxError
from kernelbridge.host.container import NAMESPACE_LABEL, STATE_LABEL, state_identity
from kernelbridge.runtime import ContainerInfo, ContainerState, RuntimeBackend
from kernelbridge.session.cell import Cell
from kernelbridge.session.outcome import Adopted, InheritedOutcome, SandboxLost
from kernelbridge.session.recorder import Recorder
from kernelbridge.session.records import SessionRecord
from kernelbridge.session.store import SessionStore
from kernelbridge.tunnel import Adoption, InheritedCell

log = logging.getLogger(__name__)

INSPECT_TIMEOUT = 10.0
REMOVE_TIMEOUT = 20.0
OUTPUT_CHARS = 2000
"""Characters of an inherited cell's output told with the first result (head and tail)."""
EXIT_REASONS = {
    5: "it ended itself after waiting its idle timeout for a bridge (KERNELBRIDGE_IDLE_TIMEOUT)",
    6: "its kernel died while no bridge was attached",
    7: "its kernel ran out of memory while no bridge was attached",
}
"""The agent's exit statuses when it ends without a bridge (``inside/agent/relay.py``)."""


@dataclass(frozen=True, slots=True)
class Loss:
    """Why a session's sandbox cannot be adopted, and whether the container is ours to remove."""

    reason: str
    remove: bool
    """The container is this session's (labels), unusable, and so removed."""


def restore_uri(record: SessionRecord) -> str:
    """The ``restore=`` argument that rebuilds ``record``'s generation from its journal
    (``NAME@N``: that generation, also once the session has started a newer one)."""
    return f"kernelbridge://sessions/{record.session}@{record.generation}/notebook"


def ours(info: ContainerInfo, record: SessionRecord, state_dir: Path) -> bool:
    """Whether the container is the one ``record`` (of ``state_dir``'s store) names: started for
    this session, or for the warm pool it was taken from (labels never change)."""
    return (
        info.labels.get(STATE_LABEL) == state_identity(state_dir)
        and info.session == record.container_label
        and info.labels.get(NAMESPACE_LABEL, "") == record.namespace
        and info.durable
    )


async def inspect(runtime: RuntimeBackend, container: str) -> ContainerInfo | None:
    """The container's state now, or, once the engine removed it after it ended itself while no
    bridge was attached (a durable sandbox is removed by the engine: no bridge may be there
    to), how it ended as the engine's event log tells: an exit status of the agent's own
    (:data:`EXIT_REASONS`). None: gone otherwise (removed, killed, the machine restarted, or the
    engine kept no record). Raises RuntimeUnavailable (the engine does not answer: nothing can
    be said, so nothing is lost)."""
    with anyio.fail_after(INSPECT_TIMEOUT):
        info = await runtime.inspect(container)
    if info is None:
        # Bounded by the backend, never raises. Only the agent's own statuses say why: a kill
        # (137, an `rm -f` by anyone, a reboot) says nothing of who or why.
        ended = await runtime.ended(container)
        if ended is not None and ended.exit_code in EXIT_REASONS:
            return ended
    return info


def other_agent(info: ContainerInfo, agent_hash: str | None) -> str | None:
    """Why the sandbox is not to be reached by a bridge expecting ``agent_hash`` (None: it may
    be): it runs another kernelbridge's agent, or says none. Reaching it would run that image's
    handover, and its agent speaks the frames of its own version; checked before reaching it."""
    if not agent_hash or info.agent_hash == agent_hash:
        return None
    found = info.agent_hash[:12] or "unknown"
    return (
        f"its sandbox runs the agent of another kernelbridge ({found}; this one's is {agent_hash[:12]}),"
        " as after an upgrade"
    )


OTHER_MOUNTS = (
    "its sandbox sees other host directories than this bridge's settings share"
    " (KERNELBRIDGE_MOUNTS or --mount changed), and a directory no longer shared must not be seen"
    " any more"
)


def check_container(
    info: ContainerInfo | None,
    record: SessionRecord,
    state_dir: Path,
    secret: str | None,
    agent_hash: str | None = None,
    mounts_shape: str | None = None,
) -> Loss | None:
    """None if the sandbox may be adopted (its own proof is the tunnel's business), else why not;
    ``agent_hash``: the agent this bridge speaks to (:func:`other_agent`); ``mounts_shape``: the
    host directories its settings share (``ContainerSpec.mounts_shape``; None: not checked)."""
    if info is None:
        return Loss(
            "its container is gone, and the engine no longer says how it ended (the machine may"
            " have restarted, it was removed, or it ended while no bridge was attached)",
            False,
        )
    if not ours(info, record, state_dir):
        return Loss("its container is not this session's (the record does not match it)", False)
    if info.state is ContainerState.EXITED:
        why = EXIT_REASONS.get(info.exit_code or -1)
        if why is None:
            why = "it ran out of memory" if info.oom_killed else f"it exited with status {info.exit_code}"
        return Loss(f"its sandbox ended while no bridge was attached: {why}", True)
    if info.state is not ContainerState.RUNNING:
        return Loss(f"its container is {info.state.value}, not running", True)
    if secret is None:
        return Loss("its secret is missing from the state directory, or not private", True)
    if why := other_agent(info, agent_hash):
        return Loss(why, True)
    if mounts_shape is not None and info.mounts_shape != mounts_shape:
        return Loss(OTHER_MOUNTS, True)
    return None


async def remove(runtime: RuntimeBackend, container: str) -> None:
    """Remove an unusable container of ours (bounded; a failure is logged, the reaper tries later)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(REMOVE_TIMEOUT):
        try:
            await runtime.remove([container])
        except RuntimeUnavailable as exc:
            log.warning("could not remove the lost sandbox %s: %s", container, exc)


def journal_cells(store: SessionStore, record: SessionRecord) -> int:
    """How many cells ``record``'s journal holds (its lines that are cells; 0 without one)."""
    count = 0
    try:
        with open(store.journal_path(record), "rb") as f:
            for line in f:
                count += line.startswith(b'{"type": "cell"')
    except OSError:
        return 0
    return count


def lost_note(record: SessionRecord, loss: Loss, cells: int) -> SandboxLost:
    return SandboxLost(loss.reason, record.generation, cells, restore_uri(record) if cells else None)


def inherited_outcome(cell: Cell, said: InheritedCell) -> InheritedOutcome:
    """How an inherited cell stands now: its own messages if they came, else the agent's word."""
    reply = cell.reply or {}
    if cell.idle or reply:
        status = str(reply.get("status") or ("error" if cell.outputs.error else "ok"))
    else:
        status = said.status
    parts = [cell.outputs.stream_text("stdout"), cell.outputs.stream_text("stderr")]
    if cell.outputs.error is not None:
        parts.append(f"{cell.outputs.error.ename}: {cell.outputs.error.evalue}")
    elif cell.outputs.result is not None:
        parts.append(f"Out: {cell.outputs.result}")
    text = "\n".join(part.strip("\n") for part in parts if part.strip())
    if len(text) > OUTPUT_CHARS:
        half = OUTPUT_CHARS // 2
        text = f"{text[:half]}\n... [{len(text) - OUTPUT_CHARS:,} characters cut] ...\n{text[-half:]}"
    count = cell.outputs.execution_count or said.execution_count
    code = (cell.code or said.code).strip()
    return InheritedOutcome(count, code[:200], status, text, bool(cell.started or cell.idle or text))


CATCH_UP_WAIT = 5.0
"""Bound of :func:`catch_up`: what the sandbox held back comes at once after ``resume`` (past a
second on a busy machine); only a kernel that does not answer on its control channel (stopped,
wedged) takes it all, and then the agent's word on its cells stands."""


class KernelRequests(Protocol):
    """The bridge's Jupyter client of the sandbox (:class:`kernelbridge.host.client.BridgeClient`)."""

    async def request(
        self,
        channel: str,
        msg_type: str,
        content: dict[str, Any],
        *,
        msg_id: str | None = None,
        wait: bool = True,
    ) -> str: ...


async def catch_up(recorder: Recorder, kernel: KernelRequests, timeout: float) -> bool:
    """Wait until every message the sandbox sent before now has been heard: what an adopted
    sandbox held back (an inherited cell's output, its end), then whatever came since. A control
    ``kernel_info_request`` of our own marks the point: the kernel publishes its idle on iopub
    behind everything it published before, and the agent and the tunnel relay one stream in order.
    Whether that was heard within ``timeout`` (or the sandbox ended: nothing more can come)."""
    msg_id = uuid.uuid4().hex
    heard = recorder.mark(msg_id)
    try:
        with anyio.move_on_after(timeout):
            await kernel.request("control", "kernel_info_request", {}, msg_id=msg_id, wait=False)
            await heard.wait()
    except SandboxError:
        return True  # not running: nothing more can come
    finally:
        recorder.unmark(msg_id)
    return heard.is_set()


def adopted_note(adoption: Adoption, inherited: list[tuple[Cell, InheritedCell]], torn: bool) -> Adopted:
    return Adopted(
        detached=adoption.detached,
        how=adoption.how,
        cells=tuple(inherited_outcome(cell, said) for cell, said in inherited),
        dropped=adoption.dropped_frames,
        dropped_bytes=adoption.dropped_bytes,
        torn_journal=torn,
    )
