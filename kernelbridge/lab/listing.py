"""What ``kernelbridge lab`` shows: one namespace's live sessions as kernels, its journals as
notebooks, and why a session listed before is not any more. Read from the session store only.

No jupyter_server here: plain functions of the store, for the lab's managers and their tests.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from kernelbridge.config import Settings, namespace_names
from kernelbridge.errors import ConfigError
from kernelbridge.session.records import SessionRecord, Standing
from kernelbridge.session.store import SessionStore

MAX_LISTED = 500
"""Sessions a lab lists at most (kernels and notebooks): more is not a page a person reads, and
each refresh reads every record listed."""
NOTEBOOK_SUFFIX = ".ipynb"
_IDS = uuid.UUID("6b7c2f4e-31a8-4d0b-9f5e-2a9c0e8d1b37")
"""Kernel ids are uuid5s in this namespace (jupyter_server's routes take only uuid-shaped ids)."""


@dataclass(frozen=True, slots=True)
class LiveSession:
    """A session a bridge holds now, as the lab's kernel of it."""

    session: str
    generation: int
    connection_file: Path
    kernel_id: str

    @property
    def notebook(self) -> str:
        return self.session + NOTEBOOK_SUFFIX


def kernel_id(store: SessionStore, record: SessionRecord) -> str:
    """The lab's kernel id of ``record``'s sandbox: the same on every refresh and after a restart of
    the lab (a bookmarked console finds it again), another for another generation or tunnel."""
    key = f"{store.root}\0{record.name}\0{record.generation}\0{record.connection_file}"
    return str(uuid.uuid5(_IDS, key))


def live_sessions(store: SessionStore) -> dict[str, LiveSession]:
    """The sessions of ``store``'s namespace that a bridge holds with a tunnel (a Jupyter client can
    connect to), by kernel id. Detached ones have no tunnel until a bridge adopts them."""
    found: dict[str, LiveSession] = {}
    for record in store.records()[:MAX_LISTED]:
        if not record.connection_file or store.standing(record) is not Standing.ATTACHED:
            continue
        kid = kernel_id(store, record)
        found[kid] = LiveSession(record.session, record.generation, Path(record.connection_file), kid)
    return found


def journalled_sessions(store: SessionStore) -> list[str]:
    """The sessions of ``store``'s namespace that have a journal (live or not), by name."""
    names = sorted(entry.name for entry in _session_dirs(store))[:MAX_LISTED]
    return [name for name in names if store.journal_or_none(name) is not None]


def _session_dirs(store: SessionStore) -> list[Path]:
    try:
        return [path for path in store.sessions_dir.iterdir() if path.is_dir() and not path.is_symlink()]
    except OSError:
        return []


def session_of_notebook(path: str) -> str | None:
    """The session a notebook path of the lab names (``<session>.ipynb`` at the top), or None."""
    path = path.strip("/")
    if "/" in path or not path.endswith(NOTEBOOK_SUFFIX):
        return None
    return path.removesuffix(NOTEBOOK_SUFFIX) or None


def gone_line(store: SessionStore, live: LiveSession) -> str:
    """The one line a person gets for a cell sent to ``live`` after its sandbox left the lab."""
    name = live.session
    return (
        f"kernelbridge lab: session {name!r} {_why_gone(store, live)}; this cell did not run. "
        f"What it journalled is kept: open {live.notebook}, "
        f"or `kernelbridge export {name} -o {live.notebook}`."
    )


def _why_gone(store: SessionStore, live: LiveSession) -> str:
    record = store.current(live.session)
    if record is None or record.generation != live.generation:
        return "was closed (a new one of that name is listed under Running when the agent starts it)"
    if record.lost:
        return f"ended: {record.lost[:200]}"
    if record.ended is not None:
        return "was closed"
    if record.detached is not None:
        return "was let go of by its bridge (the next bridge adopts it, and it is listed again)"
    if record.connection_file and Path(record.connection_file) != live.connection_file:
        return "moved to another bridge (open it again from Running)"
    return "lost its bridge (the bridge process is gone)"


def lab_namespace(settings: Settings, token: str | None) -> str:
    """The namespace a lab shows: ``""`` (the user's own sessions, stdio's) without ``token``, else
    that HTTP token's (by its name, as ``KERNELBRIDGE_HTTP_TOKENS`` gives it, or a namespace of the
    state directory). Raises ConfigError naming the ones there are."""
    if token is None:
        return ""
    known = set(namespace_names(settings.state_dir)[1:]) | _token_names(settings)
    if token not in known:
        there = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"no HTTP token named {token!r} (the tokens and namespaces here: {there})")
    return token


def _token_names(settings: Settings) -> set[str]:
    from kernelbridge.server.http import TOKEN_FILE, load_tokens

    generated = (settings.state_dir / TOKEN_FILE).exists()
    if not settings.http.tokens and settings.http.tokens_file is None and not generated:
        return set()  # nothing configured: asking would create a token
    return set(load_tokens(settings).namespaces)
