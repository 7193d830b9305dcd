"""The session store: one namespace's session records and journals on disk, by generation.

A *generation* is one life of a session name: it begins when a registry first gives the name a
sandbox (the first call after a bridge starts, after ``close_session``, after idle closing) and
ends when the session is closed. A sandbox replaced within it (a death, a discard) does not start
a new one: the journal goes on. Every generation is its own record and its own journal; nothing is
ever overwritten, so a name used again (``default`` above all) loses no earlier work.

Layout, below a namespace's state directory (``KERNELBRIDGE_STATE_DIR`` itself for stdio, and
``<state dir>/http/<namespace>/`` for an HTTP token: :func:`kernelbridge.config.namespace_state_dir`)::

    sessions/
      <name>/                        one directory per session name
        <generation>.json            its record (SessionRecord), rewritten whole as it changes
        <generation>.journal.jsonl   its journal (kernelbridge.notebook.journal), append-only
      <name>.journal.jsonl           a journal written before generations: read as generation 0
    connections/                     the live sandboxes' connection files (host.connection)

Generations are numbered from 1 in each session's directory. A new one is claimed by creating its
record file exclusively (``O_EXCL``), so two bridges on one state directory never share a number.
The *current* generation of a name, the one ``export_notebook(session)``, the notebook resource,
``restore="kernelbridge://sessions/<s>/notebook"`` and ``kernelbridge export`` mean, is the newest
one that has a journal.

What comes next builds on the record (issue 15: a sandbox that outlives its bridge; issue 17:
listing, exporting and pruning older generations): a record says which session, namespace and
generation it is, when it began, which bridge process owns it (``owner_pid``, ``owner_host``),
its container (name and id) and connection file, where its journal is, where its adoption secret
is kept (``secret``: a file of the session's directory, mode 0600, not written yet), and when it
was closed. A record without ``ended`` whose owner is gone is a session whose bridge died: today
its container is reaped. A bridge that adopts sandboxes (issue 15) finds them in :meth:`records`,
inspects ``container_id``, proves itself with the secret kept where ``secret`` says, and takes the
generation over with :meth:`update` (its own ``owner_pid``, the new connection file): the journal
goes on. Listing and exporting older generations (issue 17) is :meth:`generations`, :meth:`record`
and :meth:`journal_path`; their budget and pruning come with it.

Records are small JSON objects read as untrusted input: anything that does not decode is skipped.
Blocking file I/O: the registry calls the writing methods in worker threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from kernelbridge.config import Settings, namespace_names, namespace_state_dir
from kernelbridge.errors import SessionError
from kernelbridge.runtime.reaper import pid_alive

log = logging.getLogger(__name__)

SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Session names end up in container names and file paths: no slashes, no leading dot."""
RECORD_SUFFIX = ".json"
JOURNAL_SUFFIX = ".journal.jsonl"
RECORD_FORMAT = 1
"""The record's ``format``; a record of another format is not read."""
MAX_RECORD_BYTES = 64 * 1024
"""A record is a few hundred bytes; a bigger file is not one of ours."""
MAX_COUNTED_FILES = 100_000
"""Files :func:`disk_use` looks at; past this many it answers "full" (fail closed): a namespace's
files are its sessions' journals, its exports and its saved tools, never this many honestly."""
FULL = 1 << 62


def validate_session_name(name: object) -> str:
    """Return ``name`` if it is a valid session name; raise SessionError saying why not."""
    if not isinstance(name, str) or not SESSION_NAME.match(name):
        raise SessionError(
            f"invalid session name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One generation of one session name (see the module docstring)."""

    session: str
    generation: int
    created: float
    """Wall-clock time the generation began."""
    owner_pid: int
    """The bridge process that runs it."""
    owner_host: str
    namespace: str = ""
    connection_file: str | None = None
    """The live sandbox's connection file (``kernelbridge attach``)."""
    container: str | None = None
    """The live sandbox's container name."""
    container_id: str | None = None
    secret: str | None = None
    """Where the adoption secret is kept (a file name in the session's directory); None: none."""
    ended: float | None = None
    """Wall-clock time it was closed; None: live, or its bridge died."""

    @property
    def name(self) -> str:
        """How the operator names it: ``namespace/session`` for an HTTP token's session."""
        return f"{self.namespace}/{self.session}" if self.namespace else self.session

    @property
    def journal(self) -> str:
        """Its journal's file name in the session's directory."""
        return f"{self.generation}{JOURNAL_SUFFIX}"

    @property
    def live(self) -> bool:
        """Not closed, and its bridge process is alive."""
        return self.ended is None and self.owner_pid > 0 and pid_alive(self.owner_pid)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "session": self.session,
            "namespace": self.namespace,
            "generation": self.generation,
            "created": self.created,
            "owner_pid": self.owner_pid,
            "owner_host": self.owner_host,
            "journal": self.journal,
            "connection_file": self.connection_file,
            "container": self.container,
            "container_id": self.container_id,
            "secret": self.secret,
            "ended": self.ended,
        }

    @classmethod
    def decode(cls, raw: object) -> SessionRecord | None:
        """The record in ``raw`` (parsed JSON), or None if it is not a valid one."""
        if not isinstance(raw, dict) or raw.get("format") != RECORD_FORMAT:
            return None
        session, generation, pid = raw.get("session"), raw.get("generation"), raw.get("owner_pid")
        created, ended = raw.get("created"), raw.get("ended")
        if not isinstance(session, str) or not SESSION_NAME.match(session):
            return None
        if not _integer(generation) or not _integer(pid) or not _number(created):
            return None
        if ended is not None and not _number(ended):
            return None
        return cls(
            session=session,
            generation=generation,
            created=created,
            owner_pid=pid,
            owner_host=_text(raw.get("owner_host")) or "",
            namespace=_text(raw.get("namespace")) or "",
            connection_file=_text(raw.get("connection_file")),
            container=_text(raw.get("container")),
            container_id=_text(raw.get("container_id")),
            secret=_text(raw.get("secret")),
            ended=ended,
        )

    def listing(self) -> dict[str, Any]:
        """What ``kernelbridge sessions --json`` shows of a live session."""
        shown: dict[str, Any] = {
            "name": self.name,
            "connection_file": self.connection_file,
            "container": self.container,
            "owner_pid": self.owner_pid,
            "created": self.created,
        }
        if self.namespace:
            shown["namespace"] = self.namespace
        return shown


class SessionStore:
    """The session records and journals of one namespace (see the module docstring)."""

    def __init__(self, root: Path, namespace: str = "") -> None:
        self.root = root
        """The namespace's state directory."""
        self.namespace = namespace

    @classmethod
    def of(cls, settings: Settings) -> SessionStore:
        """The store of ``settings``' namespace (a registry's)."""
        return cls(settings.state_dir, settings.namespace)

    @classmethod
    def of_namespace(cls, state_dir: Path, namespace: str) -> SessionStore:
        """The store of ``namespace`` below the bridge's ``state_dir`` (``""``: the shared one).
        Raises ConfigError for a name that is not a namespace."""
        return cls(namespace_state_dir(state_dir, namespace), namespace)

    def __repr__(self) -> str:
        return f"<SessionStore {self.namespace or '(shared)'} {self.root}>"

    @property
    def sessions_dir(self) -> Path:
        return self.root / "sessions"

    def open(self) -> None:
        """Create the namespace's directory and its sessions directory (0700). Raises OSError."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.sessions_dir.mkdir(exist_ok=True, mode=0o700)

    def session_dir(self, session: str) -> Path:
        return self.sessions_dir / validate_session_name(session)

    def journal_path(self, record: SessionRecord) -> Path:
        return self.session_dir(record.session) / record.journal

    # -- generations -------------------------------------------------------------------------------
    def begin(
        self,
        session: str,
        *,
        connection_file: str | None = None,
        container: str | None = None,
        container_id: str | None = None,
    ) -> SessionRecord:
        """Claim the next generation of ``session`` and write its first record. Raises OSError
        (the state directory is full, read-only, or a file is where the directory should be)."""
        directory = self.session_dir(session)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        generation = max(self.generations(session), default=0) + 1
        while True:
            record = SessionRecord(
                session=session,
                generation=generation,
                created=time.time(),
                owner_pid=os.getpid(),
                owner_host=socket.gethostname(),
                namespace=self.namespace,
                connection_file=connection_file,
                container=container,
                container_id=container_id,
            )
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            path = directory / f"{generation}{RECORD_SUFFIX}"
            try:
                fd = os.open(path, flags, 0o600)
            except FileExistsError:  # another bridge claimed it first
                generation += 1
                continue
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(_dumps(record))
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            return record

    def update(self, record: SessionRecord, **changes: Any) -> SessionRecord:
        """Rewrite ``record`` with ``changes`` (whole, atomically); returns the new record.
        Raises OSError."""
        new = replace(record, **changes)
        path = self.session_dir(record.session) / f"{record.generation}{RECORD_SUFFIX}"
        tmp = path.with_name(f".{path.name}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600), "w") as out:
            out.write(_dumps(new))
        os.replace(tmp, path)
        return new

    def end(self, record: SessionRecord) -> SessionRecord:
        """Mark ``record``'s generation closed (its sandbox and connection file are gone)."""
        return self.update(record, ended=time.time(), connection_file=None)

    def generations(self, session: str) -> list[int]:
        """The generations of ``session`` that have a record or a journal, oldest first (0: a
        journal written before generations)."""
        found: set[int] = set()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.session_dir(session)):
                number = _generation_of(entry.name)
                if number is not None:
                    found.add(number)
        if self._legacy_journal(session).is_file():
            found.add(0)
        return sorted(found)

    def record(self, session: str, generation: int) -> SessionRecord | None:
        """The record of one generation, or None (none, unreadable, or not one)."""
        path = self.session_dir(session) / f"{generation}{RECORD_SUFFIX}"
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
            if len(data) > MAX_RECORD_BYTES:
                return None
            record = SessionRecord.decode(json.loads(data))
        except (OSError, ValueError, RecursionError):
            return None
        if record is None or record.session != session or record.generation != generation:
            return None
        return record

    def current(self, session: str) -> SessionRecord | None:
        """The record of ``session``'s newest generation, or None."""
        for generation in reversed(self.generations(session)):
            record = self.record(session, generation) if generation else None
            if record is not None:
                return record
        return None

    def journal(self, session: str) -> Path:
        """The journal of ``session``'s current generation (the newest that has one). Raises
        SessionError if it has none."""
        directory = self.session_dir(session)
        for generation in reversed(self.generations(session)):
            path = (
                directory / f"{generation}{JOURNAL_SUFFIX}" if generation else self._legacy_journal(session)
            )
            if path.is_file():
                return path
        raise SessionError(f"no journal for session {session!r}: it has not run any code here")

    def journal_or_none(self, session: str) -> Path | None:
        """:meth:`journal`, or None if the session has none."""
        try:
            return self.journal(session)
        except SessionError:
            return None

    def records(self) -> list[SessionRecord]:
        """The current record of every session of this namespace, by name."""
        try:
            names = sorted(e.name for e in os.scandir(self.sessions_dir) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []
        found = (self.current(name) for name in names if SESSION_NAME.match(name))
        return [record for record in found if record is not None]

    def _legacy_journal(self, session: str) -> Path:
        return self.sessions_dir / f"{validate_session_name(session)}{JOURNAL_SUFFIX}"


def live_sessions(state_dir: Path) -> list[SessionRecord]:
    """Live sessions of every bridge process using ``state_dir``, every namespace's (a bridge that
    was SIGKILLed leaves records whose owner is gone: they are left out)."""
    live: list[SessionRecord] = []
    for namespace in namespace_names(state_dir):
        live += (
            record for record in SessionStore.of_namespace(state_dir, namespace).records() if record.live
        )
    return live


def list_session_records(state_dir: Path) -> list[dict[str, Any]]:
    """:func:`live_sessions` as ``kernelbridge sessions --json`` shows them (HTTP clients' named
    ``namespace/session``)."""
    return [record.listing() for record in live_sessions(state_dir)]


def disk_use(settings: Settings) -> int:
    """Bytes of disk the files of ``settings``' namespace take on the host (each file's size or
    its allocated blocks, whichever is more): everything below its state directory (journals of
    every generation, exports, saved tools) and its export directory; :data:`FULL` past
    :data:`MAX_COUNTED_FILES` entries. Blocking."""
    total, seen = 0, 0
    pending = [settings.state_dir, *([settings.export_dir] if settings.export_dir else [])]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        seen += len(entries)
        if seen > MAX_COUNTED_FILES:
            return FULL
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    total += max(info.st_size, info.st_blocks * 512)
            except OSError:
                continue
    return total


def _generation_of(file_name: str) -> int | None:
    for suffix in (JOURNAL_SUFFIX, RECORD_SUFFIX):
        number = file_name.removesuffix(suffix)
        if number != file_name and number.isdigit() and number == str(int(number)) and int(number) > 0:
            return int(number)
    return None


def _dumps(record: SessionRecord) -> str:
    return json.dumps(record.to_json(), indent=1)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
