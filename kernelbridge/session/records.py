"""The records a session store keeps: one per session generation, one per warm sandbox.

Both are small JSON objects, rewritten whole, and read back as untrusted input: :meth:`decode`
returns None for anything that is not a valid record of this format (a hand edit, a torn write,
another program's file).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from kernelbridge.runtime.reaper import pid_alive

SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Session names end up in container names and file paths: no slashes, no leading dot."""
CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
RECORD_FORMAT = 1
"""The record's ``format``; a record of another format is not read."""
JOURNAL_SUFFIX = ".journal.jsonl"
SECRET_SUFFIX = ".secret"
MAX_SERVERS = 64
MAX_LABEL = 256


class Standing(enum.Enum):
    """A generation in one word, the same wherever it is listed (``kernelbridge sessions``,
    ``sessions --all``, ``list_sessions``' other bridges' sessions); see ``SessionStore.standing``."""

    ATTACHED = "attached"
    """A bridge holds it (this one or another): its sandbox runs with a bridge."""
    DETACHED = "detached"
    """Its sandbox runs on without a bridge; the next bridge on the state directory adopts it."""
    ENDED = "ended"
    """Closed, lost, or gone with its bridge: only its journal and record are left."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One generation of one session name (see :mod:`.store`)."""

    session: str
    generation: int
    created: float
    """Wall-clock time the generation began."""
    owner_pid: int
    """The bridge process that runs it (or last ran it)."""
    owner_host: str
    namespace: str = ""
    connection_file: str | None = None
    """The live sandbox's connection file (``kernelbridge attach``)."""
    container: str | None = None
    """The live sandbox's container name."""
    container_id: str | None = None
    label: str | None = None
    """The live sandbox's ``kernelbridge.session`` label: who its container was started for (this
    session, or the warm pool it was taken from). Adoption checks the container against it."""
    secret: str | None = None
    """Where the adoption secret is kept (a file name in the session's directory); None: none."""
    ended: float | None = None
    """Wall-clock time it was closed; None: live, detached, or its bridge died."""
    durable: bool = False
    """Its sandbox outlives its bridge (a later bridge may adopt it)."""
    servers: tuple[str, ...] = ()
    """The host MCP servers granted to it (its kernel's proxies are bound to them)."""
    detached: float | None = None
    """Wall-clock time its bridge let go of it; None while one holds it (or that one died)."""
    lost: str | None = None
    """Why it ended without a close: its sandbox was gone when a bridge came back for it."""
    owner_start: int | None = None
    """When the owner process started (``reaper.process_start``): a later process given the same
    pid is not taken for it. None: a record of a bridge before this was recorded."""

    @property
    def name(self) -> str:
        """How the operator names it: ``namespace/session`` for an HTTP token's session."""
        return f"{self.namespace}/{self.session}" if self.namespace else self.session

    @property
    def container_label(self) -> str:
        """The label its container must carry: the one recorded, else (a record of a bridge
        before labels were recorded) the session's own."""
        return self.label or self.name

    @property
    def journal(self) -> str:
        """Its journal's file name in the session's directory."""
        return f"{self.generation}{JOURNAL_SUFFIX}"

    @property
    def live(self) -> bool:
        """Not closed, and its bridge process is alive (a durable one's lock says more:
        :meth:`.store.SessionStore.holder`)."""
        return self.ended is None and self.owner_pid > 0 and pid_alive(self.owner_pid, self.owner_start)

    @property
    def adoptable(self) -> bool:
        """What a later bridge needs to adopt its sandbox is here (whether it still runs is the
        engine's answer, and whether another bridge holds it the lock's)."""
        return self.ended is None and self.durable and bool(self.container_id) and bool(self.secret)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "session": self.session,
            "namespace": self.namespace,
            "generation": self.generation,
            "created": self.created,
            "owner_pid": self.owner_pid,
            "owner_start": self.owner_start,
            "owner_host": self.owner_host,
            "journal": self.journal,
            "connection_file": self.connection_file,
            "container": self.container,
            "container_id": self.container_id,
            "label": self.label,
            "secret": self.secret,
            "ended": self.ended,
            "durable": self.durable,
            "servers": list(self.servers),
            "detached": self.detached,
            "lost": self.lost,
        }

    @classmethod
    def decode(cls, raw: object) -> SessionRecord | None:
        """The record in ``raw`` (parsed JSON), or None if it is not a valid one."""
        if not isinstance(raw, dict) or raw.get("format") != RECORD_FORMAT:
            return None
        session, generation, pid = raw.get("session"), raw.get("generation"), raw.get("owner_pid")
        created, ended, detached = raw.get("created"), raw.get("ended"), raw.get("detached")
        if not isinstance(session, str) or not SESSION_NAME.match(session):
            return None
        if not integer(generation) or not integer(pid) or not number(created):
            return None
        if (ended is not None and not number(ended)) or (detached is not None and not number(detached)):
            return None
        secret = text(raw.get("secret"))
        servers = raw.get("servers")
        return cls(
            session=session,
            generation=generation,
            created=created,
            owner_pid=pid,
            owner_host=text(raw.get("owner_host")) or "",
            namespace=text(raw.get("namespace")) or "",
            connection_file=text(raw.get("connection_file")),
            container=text(raw.get("container")),
            container_id=text(raw.get("container_id")),
            label=label if (label := text(raw.get("label"))) and len(label) <= MAX_LABEL else None,
            # Only a file of the session's own directory, named as the store names them.
            secret=secret if secret is not None and _secret_name(secret) else None,
            ended=ended,
            durable=raw.get("durable") is True,
            servers=tuple(s for s in servers if isinstance(s, str))[:MAX_SERVERS]
            if isinstance(servers, list)
            else (),
            detached=detached,
            lost=text(raw.get("lost")),
            owner_start=start if integer(start := raw.get("owner_start")) else None,
        )

    def listing(self) -> dict[str, Any]:
        """What ``kernelbridge sessions --json`` shows of it."""
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


@dataclass(frozen=True, slots=True)
class WarmRecord:
    """A durable warm-pool sandbox (no session yet) that a later bridge may adopt into its pool."""

    container: str
    """Its container name (also the record's file name)."""
    container_id: str
    created: float
    owner_pid: int
    owner_host: str
    detached: float | None = None
    owner_start: int | None = None

    @property
    def secret(self) -> str:
        return f"{self.container}{SECRET_SUFFIX}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "container": self.container,
            "container_id": self.container_id,
            "created": self.created,
            "owner_pid": self.owner_pid,
            "owner_host": self.owner_host,
            "detached": self.detached,
            "owner_start": self.owner_start,
        }

    @classmethod
    def decode(cls, raw: object) -> WarmRecord | None:
        if not isinstance(raw, dict) or raw.get("format") != RECORD_FORMAT:
            return None
        container, cid, created, pid = (
            raw.get("container"), raw.get("container_id"), raw.get("created"), raw.get("owner_pid")
        )  # fmt: skip
        detached = raw.get("detached")
        if not isinstance(container, str) or not CONTAINER_NAME.match(container):
            return None
        if not isinstance(cid, str) or not cid or not number(created) or not integer(pid):
            return None
        return cls(
            container,
            cid,
            created,
            pid,
            text(raw.get("owner_host")) or "",
            detached if number(detached) else None,
            start if integer(start := raw.get("owner_start")) else None,
        )


def _secret_name(name: str) -> bool:
    number_part = name.removesuffix(SECRET_SUFFIX)
    return number_part != name and number_part.isdigit()


def text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
