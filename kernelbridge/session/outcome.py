"""What a call's result says about its cell and its session, as values: no English here.

A ``run_python`` result carries a :class:`Status` (how the cell ended), a :class:`State` (whether
the session's variables survived) and a list of :class:`Note` records: one small frozen record
per thing the model should be told (the sandbox died, the cell timed out and how it was stopped,
the journal is full, ...), each with the numbers and reasons it needs. The session layer makes
them; :mod:`kernelbridge.server.render` is the one place they become sentences (and the
``notes`` of ``structuredContent``, beside their machine-readable ``note_codes``). Tests assert on
these values; the renderer's own tests pin the wording.

The server adds notes of its own (images, files placed, a restore, unlimited sandboxes): they
subclass :class:`Note` in :mod:`kernelbridge.server.notes`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from kernelbridge.errors import ExitKind


class Status(enum.StrEnum):
    """How a cell ended (``structuredContent.status``)."""

    OK = "ok"
    ERROR = "error"
    """The code raised (or the kernel answered ``error``/``aborted``)."""
    TIMEOUT = "timeout"
    KERNEL_DIED = "kernel_died"
    """The sandbox died, could not take the cell, or the session was closed while it ran."""
    CANCELLED = "cancelled"
    """The caller gave up (the MCP request was cancelled): journalled, never returned."""


class State(enum.StrEnum):
    """Whether the session's variables survived the call (``structuredContent.state``)."""

    KEPT = "kept"
    LOST = "lost"


class Stop(enum.Enum):
    """How a cell that overran its deadline was stopped (see :mod:`kernelbridge.session.runner`)."""

    INTERRUPTED = "interrupted"
    """It stopped within the grace after SIGINT: the variables are kept."""
    RESTARTED = "restarted"
    """The kernel was restarted in its container: variables lost, files in /workspace kept."""
    DISCARDED = "discarded"
    """Even the restart did not finish in time: the sandbox is gone with its files."""

    @property
    def state(self) -> State:
        return State.KEPT if self is Stop.INTERRUPTED else State.LOST


class NoteCode(enum.StrEnum):
    """The machine-readable kind of a note (``structuredContent.note_codes``)."""

    FRESH_SANDBOX = "fresh_sandbox"
    SANDBOX_DIED = "sandbox_died"
    NOT_SENT = "not_sent"
    CLOSED_WHILE_RUNNING = "closed_while_running"
    TIMED_OUT = "timed_out"
    UNRESPONSIVE = "unresponsive"
    NEVER_STARTED = "never_started"
    WAITED = "waited"
    PROXIES_NOT_REFRESHED = "proxies_not_refreshed"
    BACKGROUND_OUTPUT = "background_output"
    DISPLAYS_DROPPED = "displays_dropped"
    JOURNAL_FULL = "journal_full"
    JOURNAL_FAILED = "journal_failed"
    ADOPTED = "adopted"
    SANDBOX_LOST = "sandbox_lost"
    QUEUED = "queued"


class Note:
    """Something a result tells the model about the session or the cell (see the module
    docstring). Subclasses are frozen slotted dataclasses with a ``code``."""

    __slots__ = ()
    code: ClassVar[str]


@dataclass(frozen=True, slots=True)
class FreshSandbox(Note):
    """This call started a fresh sandbox: earlier variables, imports and files are gone."""

    code: ClassVar[str] = NoteCode.FRESH_SANDBOX
    died: str | None
    """Why the previous one died; None: it was discarded (a timeout, or it took no cell)."""
    cells: int = 0
    """Cells in the session's journal when it died (what a restore would re-run)."""
    restore: str | None = None
    """The ``restore=`` argument that re-runs them (None: it was discarded, or had none)."""


@dataclass(frozen=True, slots=True)
class SandboxDied(Note):
    """The sandbox died while the cell ran; the next call starts a fresh one."""

    code: ClassVar[str] = NoteCode.SANDBOX_DIED
    reason: str
    kind: ExitKind | None = None


@dataclass(frozen=True, slots=True)
class NotSent(Note):
    """The cell could not be sent (the sandbox died or does not drain its stdin): discarded."""

    code: ClassVar[str] = NoteCode.NOT_SENT
    reason: str


@dataclass(frozen=True, slots=True)
class ClosedWhileRunning(Note):
    """The session was closed (``close_session``, the bridge stopping) while the cell ran."""

    code: ClassVar[str] = NoteCode.CLOSED_WHILE_RUNNING


@dataclass(frozen=True, slots=True)
class TimedOut(Note):
    """The cell overran its ``timeout`` and was stopped so."""

    code: ClassVar[str] = NoteCode.TIMED_OUT
    timeout: float
    stop: Stop


@dataclass(frozen=True, slots=True)
class Unresponsive(Note):
    """The kernel did not even begin the cell within ``timeout`` while nothing else ran."""

    code: ClassVar[str] = NoteCode.UNRESPONSIVE
    timeout: float
    stop: Stop


@dataclass(frozen=True, slots=True)
class NeverStarted(Note):
    """Another client's cell held the kernel for ``waited`` seconds (the maximum timeout); this
    cell is still queued in the kernel and will run when it is free."""

    code: ClassVar[str] = NoteCode.NEVER_STARTED
    waited: float


@dataclass(frozen=True, slots=True)
class Waited(Note):
    """The cell waited ``seconds`` behind another client's cell before it began."""

    code: ClassVar[str] = NoteCode.WAITED
    seconds: float


@dataclass(frozen=True, slots=True)
class Queued(Note):
    """The call queued behind ``ahead`` (a long job: an MCP task), which had been running for
    ``started_ago`` seconds, and waited ``seconds`` for it."""

    code: ClassVar[str] = NoteCode.QUEUED
    ahead: str
    started_ago: float
    seconds: float


@dataclass(frozen=True, slots=True)
class ProxiesNotRefreshed(Note):
    """The kernel's ``mcp_<server>`` proxies could not be rebound to the session's grants."""

    code: ClassVar[str] = NoteCode.PROXIES_NOT_REFRESHED


@dataclass(frozen=True, slots=True)
class BackgroundOutput(Note):
    """Output that arrived outside any cell since the last call (bounded text)."""

    code: ClassVar[str] = NoteCode.BACKGROUND_OUTPUT
    text: str
    displays: int


@dataclass(frozen=True, slots=True)
class DisplaysDropped(Note):
    """Rich outputs of the cell past the per-cell bounds were counted, not kept."""

    code: ClassVar[str] = NoteCode.DISPLAYS_DROPPED
    count: int
    limit: int


@dataclass(frozen=True, slots=True)
class JournalFull(Note):
    """The journal reached its byte budget: this cell and later ones are not recorded."""

    code: ClassVar[str] = NoteCode.JOURNAL_FULL
    budget: int
    """Bytes the journal was allowed."""
    setting: str
    """The setting that gave the budget: ``KERNELBRIDGE_JOURNAL_BUDGET`` or the token's quota."""
    quota: int | None = None
    """The namespace's disk quota in bytes, when that is what ran out."""


@dataclass(frozen=True, slots=True)
class JournalFailed(Note):
    """A journal write failed: the notebook misses cells from here on."""

    code: ClassVar[str] = NoteCode.JOURNAL_FAILED
    reason: str


@dataclass(frozen=True, slots=True)
class InheritedOutcome:
    """A cell the bridge before this one sent, as it stands (an adopted sandbox's)."""

    execution_count: int | None
    code: str
    """Its first characters."""
    status: str
    """``running``, ``ok``, ``error``, ``aborted``."""
    output: str
    """Its output so far (bounded; empty when none came)."""
    heard: bool
    """Some of its messages reached this bridge (else only the sandbox's word on how it stands)."""


@dataclass(frozen=True, slots=True)
class Adopted(Note):
    """The session's sandbox outlived its bridge and this bridge took it over: the variables are
    kept. What happened meanwhile comes with it."""

    code: ClassVar[str] = NoteCode.ADOPTED
    detached: float
    """Seconds no bridge was attached."""
    how: str | None
    """How the bridge before left: ``detach`` (it exited), ``eof``/``broken`` (it went without a
    word: killed, or its client), ``silent`` (it stopped answering); None: unknown."""
    cells: tuple[InheritedOutcome, ...] = ()
    dropped: int = 0
    """Messages of output the sandbox dropped past its buffer while detached."""
    dropped_bytes: int = 0
    torn_journal: bool = False
    """The journal's last line was cut off (the bridge before died mid-write); it is skipped."""


@dataclass(frozen=True, slots=True)
class SandboxLost(Note):
    """The session's sandbox outlived its bridge but could not be taken over: it is gone (the
    machine restarted), it ended (its idle timeout, its kernel died), or it is not the one this
    session made (a wrong secret, garbage). Its variables and files are lost."""

    code: ClassVar[str] = NoteCode.SANDBOX_LOST
    reason: str
    generation: int
    cells: int
    """Cells in that generation's journal."""
    restore: str | None
    """The ``restore=`` argument that rebuilds them (None: nothing to rebuild)."""
    ran: bool = True
    """This call's code ran (in a fresh sandbox); False: it did not, so the model can choose."""
    rebuilt: bool = False
    """Its cells were re-run from the journal first (``KERNELBRIDGE_AUTO_RESTORE``)."""


SessionNote = (
    FreshSandbox
    | SandboxDied
    | NotSent
    | ClosedWhileRunning
    | TimedOut
    | Unresponsive
    | NeverStarted
    | Waited
    | ProxiesNotRefreshed
    | BackgroundOutput
    | DisplaysDropped
    | JournalFull
    | JournalFailed
    | Adopted
    | SandboxLost
    | Queued
)
"""Every note the session layer makes."""
