"""The session store: one namespace's session records and journals on disk, by generation.

Nothing is ever overwritten: each generation (one life of a session name) has its own record and
journal, and is claimed by creating its record with ``O_EXCL``, so two bridges on one state
directory never share one. The *current* generation of a name is the newest one with a journal.
Records are read as untrusted input: what does not decode is skipped. Blocking file I/O: the
registry calls the writing methods in worker threads.

Layout and adoption: docs/design/sessions.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernelbridge.config import Settings, namespace_names, namespace_state_dir
from kernelbridge.errors import SessionError
from kernelbridge.runtime.reaper import own_start
from kernelbridge.session.ownership import (
    Claim,
    claim,
    held_elsewhere,
    move_secret,
    read_secret,
    write_secret,
)
from kernelbridge.session.records import (
    CONTAINER_NAME,
    JOURNAL_SUFFIX,
    SECRET_SUFFIX,
    SESSION_NAME,
    SessionRecord,
    Standing,
    WarmRecord,
)

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"
LOCK_FILE = "owner.lock"
"""A session directory's ownership lock (:mod:`.ownership`)."""
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
        label: str | None = None,
        secret: str | None = None,
        servers: tuple[str, ...] = (),
    ) -> SessionRecord:
        """Claim the next generation of ``session`` and write its first record (with ``secret``:
        a durable sandbox's, kept beside it first). Raises OSError (the state directory is full,
        read-only, or a file is where the directory should be)."""
        directory = self.session_dir(session)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        generation = max(self.generations(session), default=0) + 1
        while True:
            record = SessionRecord(
                session=session,
                generation=generation,
                created=time.time(),
                owner_pid=os.getpid(),
                owner_start=own_start(),
                owner_host=socket.gethostname(),
                namespace=self.namespace,
                connection_file=connection_file,
                container=container,
                container_id=container_id,
                label=label,
                durable=secret is not None,
                servers=servers,
                secret=f"{generation}{SECRET_SUFFIX}" if secret is not None else None,
            )
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            path = directory / f"{generation}{RECORD_SUFFIX}"
            try:
                fd = os.open(path, flags, 0o600)
            except FileExistsError:  # another bridge claimed it first
                generation += 1
                continue
            try:
                if secret is not None:
                    self._keep_secret(directory / f"{generation}{SECRET_SUFFIX}", secret)
                with os.fdopen(fd, "w") as out:
                    out.write(_dumps(record))
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            return record

    def _keep_secret(self, path: Path, secret: str) -> None:
        """A durable sandbox's secret beside its record: taken from the warm sandbox it came from
        (``secret`` is then ``warm:<container>``), or written new."""
        if secret.startswith("warm:"):
            if not move_secret(self.warm_dir / f"{secret[5:]}{SECRET_SUFFIX}", path):
                raise FileNotFoundError(f"the warm sandbox {secret[5:]} has no secret")
        else:
            write_secret(path, secret)

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
        """Mark ``record``'s generation closed (its sandbox and connection file are gone); its
        secret is deleted (nothing can be adopted with it any more)."""
        self._forget_secret(record)
        return self.update(record, ended=time.time(), connection_file=None)

    def lose(self, record: SessionRecord, why: str) -> SessionRecord:
        """End ``record``'s generation because its sandbox was gone when a bridge came back."""
        self._forget_secret(record)
        return self.update(record, ended=time.time(), connection_file=None, lost=why[:500])

    def detach(self, record: SessionRecord) -> SessionRecord:
        """Its bridge let go of the durable sandbox (which runs on): say when."""
        return self.update(record, detached=time.time(), connection_file=None)

    def rekey(self, record: SessionRecord, secret: str) -> SessionRecord:
        """Its sandbox was replaced (the old one died): keep the new sandbox's secret instead.
        Raises OSError."""
        self._forget_secret(record)
        name = f"{record.generation}{SECRET_SUFFIX}"
        write_secret(self.session_dir(record.session) / name, secret)
        return self.update(record, secret=name, durable=True)

    def _forget_secret(self, record: SessionRecord) -> None:
        if record.secret:
            with contextlib.suppress(OSError):
                (self.session_dir(record.session) / record.secret).unlink()

    # -- ownership and secrets -----------------------------------------------------------------------
    def claim(self, session: str) -> Claim | None:
        """Hold ``session``'s name (its ownership lock); None if another bridge holds it. Raises
        OSError (the state directory cannot be written)."""
        directory = self.session_dir(session)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return claim(directory / LOCK_FILE)

    def holder(self, record: SessionRecord) -> bool:
        """Whether a bridge holds ``record``'s session now (a probe of its lock)."""
        return held_elsewhere(self.session_dir(record.session) / LOCK_FILE)

    def standing(self, record: SessionRecord) -> Standing:
        """Where ``record``'s generation is now, in the one word every listing uses."""
        if record.ended is not None:
            return Standing.ENDED
        if record.durable:
            if self.holder(record):
                return Standing.ATTACHED
            return Standing.DETACHED if record.adoptable else Standing.ENDED
        # A sandbox that ends with its bridge: gone if that bridge is.
        return Standing.ATTACHED if record.live else Standing.ENDED

    def secret(self, record: SessionRecord) -> str | None:
        """The secret of ``record``'s durable sandbox, or None (none, or not to be trusted)."""
        if not record.secret:
            return None
        return read_secret(self.session_dir(record.session) / record.secret)

    def adoptable(self) -> list[SessionRecord]:
        """The current records whose durable sandbox a bridge could adopt and no bridge holds."""
        return [r for r in self.records() if r.adoptable and not self.holder(r)]

    # -- the warm pool's durable sandboxes -------------------------------------------------------------
    @property
    def warm_dir(self) -> Path:
        return self.root / "warm"

    def save_warm(self, record: WarmRecord, secret: str) -> Claim | None:
        """Keep a durable warm sandbox's record and secret, and hold it; None if that failed
        (logged: the sandbox is still pooled, but not adoptable)."""
        try:
            self.warm_dir.mkdir(exist_ok=True, mode=0o700)
            held = claim(self.warm_dir / f"{record.container}.lock")
            write_secret(self.warm_dir / record.secret, secret)
            self._write(self.warm_dir / f"{record.container}{RECORD_SUFFIX}", record.to_json())
        except OSError as exc:
            log.warning("keeping warm sandbox %s for later bridges failed: %s", record.container, exc)
            return None
        return held

    def warm(self) -> list[tuple[WarmRecord, Claim]]:
        """The durable warm sandboxes no bridge holds, each now held by this one."""
        found = []
        for record in self.warm_records():
            held = claim(self.warm_dir / f"{record.container}.lock", attempts=1)
            if held is not None:
                found.append((record, held))
        return found

    def warm_records(self) -> list[WarmRecord]:
        """Every durable warm sandbox's record (held by a bridge or not)."""
        try:
            names = sorted(e.name for e in os.scandir(self.warm_dir) if e.name.endswith(RECORD_SUFFIX))
        except OSError:
            return []
        records = [WarmRecord.decode(_read_json(self.warm_dir / name)) for name in names]
        return [
            r for r, name in zip(records, names, strict=True) if r and name == f"{r.container}{RECORD_SUFFIX}"
        ]

    def warm_secret(self, record: WarmRecord) -> str | None:
        return read_secret(self.warm_dir / record.secret)

    def detach_warm(self, record: WarmRecord) -> None:
        with contextlib.suppress(OSError):
            path = self.warm_dir / f"{record.container}{RECORD_SUFFIX}"
            self._write(path, replace(record, detached=time.time()).to_json())

    def drop_warm(self, container: str) -> None:
        """Forget a warm sandbox (taken by a session, closed, or gone); its secret too unless a
        session took it."""
        if not CONTAINER_NAME.match(container):
            return
        for suffix in (RECORD_SUFFIX, SECRET_SUFFIX, ".lock"):
            with contextlib.suppress(OSError):
                (self.warm_dir / f"{container}{suffix}").unlink()

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600), "w") as out:
            out.write(json.dumps(data, indent=1))
        os.replace(tmp, path)

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
        record = SessionRecord.decode(_read_json(self.session_dir(session) / f"{generation}{RECORD_SUFFIX}"))
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
    """Sessions of every namespace of ``state_dir`` that a bridge holds (a bridge that was
    SIGKILLed leaves records whose owner is gone: they are left out; so are detached ones)."""
    return [record for record, standing in sessions_of(state_dir) if standing is Standing.ATTACHED]


def sessions_of(state_dir: Path) -> list[tuple[SessionRecord, Standing]]:
    """Every session of ``state_dir`` (every namespace's) that has not ended: attached to a bridge,
    or detached (its sandbox left running for a later bridge; whether it still runs is the
    engine's answer)."""
    found: list[tuple[SessionRecord, Standing]] = []
    for namespace in namespace_names(state_dir):
        store = SessionStore.of_namespace(state_dir, namespace)
        for record in store.records():
            if (standing := store.standing(record)) is not Standing.ENDED:
                found.append((record, standing))
    return found


def adoptable_containers(state_dir: Path) -> set[str]:
    """The containers (ids and names) of every namespace's durable sessions that a bridge may
    still adopt: the orphan reaper spares them."""
    found: set[str] = set()
    for record, _ in sessions_of(state_dir):
        found.update(name for name in (record.container_id, record.container) if name)
    return found


def list_session_records(state_dir: Path) -> list[dict[str, Any]]:
    """:func:`sessions_of` as ``kernelbridge sessions --json`` shows them (HTTP clients' named
    ``namespace/session``), each with its :class:`~.records.Standing` as ``state``."""
    listed = []
    for record, standing in sessions_of(state_dir):
        shown = record.listing()
        shown["state"] = standing.value
        if standing is Standing.DETACHED:
            shown["connection_file"] = None
            shown["detached"] = record.detached
        listed.append(shown)
    return listed


def warm_sandboxes(state_dir: Path) -> dict[Standing, int]:
    """How many durable warm-pool sandboxes of every namespace are held by a bridge (ATTACHED)
    or wait detached for the next one."""
    counts = {Standing.ATTACHED: 0, Standing.DETACHED: 0}
    for namespace in namespace_names(state_dir):
        store = SessionStore.of_namespace(state_dir, namespace)
        for record in store.warm_records():
            held = held_elsewhere(store.warm_dir / f"{record.container}.lock")
            counts[Standing.ATTACHED if held else Standing.DETACHED] += 1
    return counts


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


def _read_json(path: Path) -> object:
    """A small JSON file (at most MAX_RECORD_BYTES), parsed; None if it is none."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            return None
        return json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None
