"""Every generation of every session name, old ones included: naming one (``NAME@N``), listing, pruning.

A bare name is the current generation. :func:`prune` removes the oldest old generations until they
fit ``KERNELBRIDGE_HISTORY_BUDGET``, never a live one nor one whose bridge might still write it.
Blocking file I/O, bounded: a state directory's namespaces and session names are listed once, and
each generation costs a few ``stat`` calls and one small record read.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelbridge.config import Settings, namespace_names
from kernelbridge.errors import SessionError
from kernelbridge.notebook.displays import journal_entries
from kernelbridge.notebook.export import write_notebook
from kernelbridge.notebook.journal import journal_read_limit
from kernelbridge.session.records import JOURNAL_SUFFIX, SESSION_NAME, SessionRecord, Standing
from kernelbridge.session.store import RECORD_SUFFIX, SessionStore, validate_session_name

_REF = re.compile(r"^(?P<name>[^@]+)@(?P<generation>0|[1-9][0-9]{0,8})$")
BUDGET_SETTING = "KERNELBRIDGE_HISTORY_BUDGET"


def parse_ref(text: object) -> tuple[str, int | None]:
    """A session name, or ``name@generation``: (the valid name, the generation or None for the
    current one). Raises SessionError saying why ``text`` is neither."""
    if isinstance(text, str) and (match := _REF.match(text)):
        return validate_session_name(match["name"]), int(match["generation"])
    if isinstance(text, str) and "@" in text:
        raise SessionError(
            f"invalid session {text[:80]!r}: a generation is named NAME@N, N a generation number "
            "(`kernelbridge sessions --all` lists them)"
        )
    return validate_session_name(text), None


def journal_of(store: SessionStore, ref: str) -> Path:
    """The journal of ``ref`` (a name: its current generation; ``name@N``: generation N) in
    ``store``. Raises SessionError (a bad name, no such generation, no journal)."""
    name, generation = parse_ref(ref)
    if generation is None:
        return store.journal(name)
    path = _journal_path(store, name, generation)
    if not path.is_file():
        known = ", ".join(map(str, store.generations(name))) or "none"
        raise SessionError(f"session {name!r} has no generation {generation} with a journal (it has {known})")
    return path


def export_session(settings: Settings, session: str, path: Path | str) -> Path:
    """``kernelbridge export``: write the notebook of ``session``'s current generation (or, for
    ``NAME@N``, generation N) to ``path`` (a session of another bridge process too), one cell at a
    time. Raises SessionError (a bad name, no journal), OSError (``path`` cannot be written)."""
    journal = journal_of(SessionStore.of(settings), session)
    session = parse_ref(session)[0]
    target = Path(path).expanduser()
    with open(target, "w", encoding="utf-8") as out:
        write_notebook(journal_entries(journal, journal_read_limit(settings)), session, out)
    return target


def _journal_path(store: SessionStore, name: str, generation: int) -> Path:
    if generation == 0:  # a journal of a bridge before generations
        return store.sessions_dir / f"{name}{JOURNAL_SUFFIX}"
    return store.session_dir(name) / f"{generation}{JOURNAL_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation of one session name, as ``kernelbridge sessions --all`` shows it."""

    namespace: str
    session: str
    generation: int
    record: SessionRecord | None
    """None: a journal without a readable record (generation 0, a record edited by hand)."""
    journal: Path
    bytes: int
    """Disk its record and journal take."""
    current: bool
    """The newest generation with a journal: what the bare name means."""
    standing: Standing = Standing.ENDED
    """Where it is now (a journal without a record: ended)."""

    @property
    def name(self) -> str:
        """``[namespace/]session@generation``."""
        prefix = f"{self.namespace}/" if self.namespace else ""
        return f"{prefix}{self.session}@{self.generation}"

    @property
    def live(self) -> bool:
        """A bridge holds it, or its sandbox runs on for the next one: not history yet."""
        return self.standing is not Standing.ENDED

    def name_is(self, session: str) -> bool:
        """Whether ``session`` (``name`` or ``namespace/name``) names this generation's session."""
        return session == (f"{self.namespace}/{self.session}" if self.namespace else self.session)

    @property
    def state(self) -> str:
        return self.standing.value

    @property
    def writer_alive(self) -> bool:
        """Its bridge process may still write it (not ended, owner alive)."""
        record = self.record
        return record is not None and record.ended is None and record.live

    @property
    def began(self) -> float:
        return self.record.created if self.record is not None else _mtime(self.journal)

    def listing(self) -> dict[str, Any]:
        record = self.record
        return {
            "name": self.name,
            "session": self.session,
            "namespace": self.namespace,
            "generation": self.generation,
            "state": self.state,
            "current": self.current,
            "created": self.began,
            "ended": record.ended if record is not None else None,
            "owner_pid": record.owner_pid if record is not None else None,
            "bytes": self.bytes,
            "journal": str(self.journal),
        }


def list_generations(state_dir: Path) -> list[Generation]:
    """Every generation of every session of every namespace below ``state_dir``, by namespace,
    name and generation."""
    found: list[Generation] = []
    for namespace in namespace_names(state_dir):
        store = SessionStore.of_namespace(state_dir, namespace)
        names: set[str] = set()
        with contextlib.suppress(OSError):
            for entry in os.scandir(store.sessions_dir):
                name = entry.name.removesuffix(JOURNAL_SUFFIX)
                if SESSION_NAME.match(name) and (entry.is_dir(follow_symlinks=False) or name != entry.name):
                    names.add(name)
        for name in sorted(names):
            found += _generations_of(store, namespace, name)
    return found


def _generations_of(store: SessionStore, namespace: str, name: str) -> list[Generation]:
    numbers = store.generations(name)
    with_journal = [n for n in numbers if _journal_path(store, name, n).is_file()]
    current = with_journal[-1] if with_journal else None
    listed = []
    for number in numbers:
        journal = _journal_path(store, name, number)
        record_path = store.session_dir(name) / f"{number}{RECORD_SUFFIX}"
        size = sum(_size(path) for path in (journal, record_path))
        record = store.record(name, number) if number else None
        standing = store.standing(record) if record is not None else Standing.ENDED
        listed.append(Generation(namespace, name, number, record, journal, size, number == current, standing))
    return listed


def history_bytes(generations: list[Generation]) -> int:
    """Disk the old generations (those not live) take."""
    return sum(g.bytes for g in generations if not g.live)


def history_over_budget(state_dir: Path, budget: int) -> str | None:
    """One line saying that old generations take more than ``budget``, or None."""
    used = history_bytes(list_generations(state_dir))
    if used <= budget:
        return None
    return (
        f"old session generations take {_mib(used)} of the state directory, over {BUDGET_SETTING} "
        f"({_mib(budget)}); nothing is removed on its own: `kernelbridge prune` removes the oldest "
        "(`kernelbridge sessions --all` lists them)"
    )


def prune(
    state_dir: Path, budget: int, *, dry_run: bool = False, session: str | None = None
) -> list[Generation]:
    """Remove the oldest old generations (of ``session`` only, if given) until the old ones take
    at most ``budget`` bytes; returns those removed (or, ``dry_run``, those that would be). Never
    a live generation, nor one whose bridge may still write it. Raises OSError."""
    generations = list_generations(state_dir)
    used = history_bytes(generations)
    candidates = sorted(
        (
            g
            for g in generations
            if not g.live and not g.writer_alive and (session is None or g.name_is(session))
        ),
        key=lambda g: (g.began, g.generation),
    )
    removed: list[Generation] = []
    for generation in candidates:
        if used <= budget:
            break
        if not dry_run:
            _remove(state_dir, generation)
        used -= generation.bytes
        removed.append(generation)
    return removed


def _remove(state_dir: Path, generation: Generation) -> None:
    store = SessionStore.of_namespace(state_dir, generation.namespace)
    generation.journal.unlink(missing_ok=True)
    if generation.generation:
        (store.session_dir(generation.session) / f"{generation.generation}{RECORD_SUFFIX}").unlink(
            missing_ok=True
        )
        with contextlib.suppress(OSError):  # the session's directory, once it holds nothing
            store.session_dir(generation.session).rmdir()


def _size(path: Path) -> int:
    try:
        info = path.stat()
    except OSError:
        return 0
    return max(info.st_size, info.st_blocks * 512)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
