"""The container runtime seam: what a sandbox needs from a container engine, as streams and records.

A backend creates a container from a :class:`ContainerSpec`, attaches to its stdio as one duplex
byte stream (:class:`ContainerStream`: the frame tunnel runs over it), and stops, removes, inspects
and lists containers; it also owns every engine-specific chore around the image (presence, labels,
import, tag, removal). Nothing above this package spawns a runtime CLI or speaks an engine API:
they talk to :class:`RuntimeBackend`, and only ``runtime/`` branches on runtime names.

Backends:

- ``engine.EngineRuntime``: the Docker Engine API (dockerd, or ``podman system service``), local
  or remote, over one shared async connection pool; attaching hijacks the HTTP connection, so no
  client process runs per sandbox;
- ``cli.CliRuntime``: the ``podman`` / ``docker`` command line (the fallback): one ``start -ai``
  client process per sandbox carries its stdio;
- ``local.LocalProcessRuntime``: a TEST DOUBLE that runs the agent as a plain local subprocess
  (no container, no isolation) for fast tests of the tunnel and the sessions; it can never be
  selected by a user setting.

Errors: a backend raises :class:`~kernelbridge.errors.RuntimeUnavailable` when the engine cannot
be reached or refuses (its own message translated into one line), and
:class:`~kernelbridge.errors.ImageError` when the image is missing. A container that does not
exist is never an error for ``stop``/``remove`` (they are idempotent) and is ``None`` for
``inspect``.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from anyio.abc import ByteStream

from kernelbridge.config import SandboxLimits

SESSION_LABEL = "kernelbridge.session"
OWNER_LABEL = "kernelbridge.owner"
"""Label holding the pid of the bridge process that owns the container: used to find orphans."""
HOST_LABEL = "kernelbridge.host"
"""Label holding the host name of the owning bridge: an engine shared by several machines must
not let one bridge reap another machine's containers because a pid happens to be unused here."""
WORKDIR = "/workspace"
READ_ONLY_TMPFS = "ro,size=64k,mode=755,nosuid,nodev,noexec"
"""Options of the empty, read-only tmpfs mounted over /run and /var/tmp of a read-only sandbox."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Everything needed to create one sandbox container (see DESIGN.md for the flags)."""

    image: str
    name: str
    session: str
    owner_pid: int
    owner_host: str = ""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env: tuple[tuple[str, str], ...] = ()
    """Extra variables for the kernel; nothing of the host's environment enters by default."""
    command: tuple[str, ...] = ()
    """Overrides the image's CMD (the agent) when not empty."""
    labels: tuple[tuple[str, str], ...] = ()
    """Labels beyond the session/owner/host ones."""

    def all_labels(self) -> dict[str, str]:
        labels = {SESSION_LABEL: self.session, OWNER_LABEL: str(self.owner_pid)}
        if self.owner_host:
            labels[HOST_LABEL] = self.owner_host
        labels.update(self.labels)
        return labels


class ContainerState(enum.Enum):
    """Where a container is in its life, as the engine reports it."""

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    """Stopped (exited, or killed); ``exit_code`` and ``oom_killed`` say how."""
    REMOVING = "removing"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container as inspected or listed by the engine."""

    id: str
    name: str
    labels: dict[str, str]
    state: ContainerState
    exit_code: int | None = None
    oom_killed: bool = False
    """The engine saw the container's cgroup hit its memory limit (the kernel, or the agent, was
    OOM-killed). Only ``inspect`` fills this in; listings leave it False."""

    @property
    def owner_pid(self) -> int | None:
        raw = self.labels.get(OWNER_LABEL, "")
        return int(raw) if raw.isdigit() else None

    @property
    def owner_host(self) -> str:
        return self.labels.get(HOST_LABEL, "")

    @property
    def session(self) -> str:
        return self.labels.get(SESSION_LABEL, "")


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """What ``doctor`` and the capabilities text need to know about an engine."""

    name: str
    """The backend, e.g. ``podman-api``, ``docker-cli``."""
    engine: str
    """``podman`` or ``docker``."""
    version: str
    endpoint: str
    """Where the engine is reached (``unix:///run/podman/podman.sock``, ``tcp://...``, the CLI path)."""
    rootless: bool = False
    cgroup_version: str = ""
    """``v1`` or ``v2`` as the engine reports it."""
    oci_runtime: str = ""
    limits_enforced: bool = True
    """False where the engine silently ignores --memory and --pids-limit (rootless on cgroup v1)."""


class ContainerStream(ByteStream):
    """The container's stdin and stdout as one duplex byte stream (an anyio ByteStream).

    ``receive`` yields stdout bytes (frames) and raises ``anyio.EndOfStream`` when the container's
    stdout closes; ``send`` writes to stdin; ``send_eof`` closes stdin (the agent exits on EOF);
    ``aclose`` drops the attachment (it does not stop the container). The container's stderr
    never mixes into stdout: the last lines are kept, bounded, for diagnostics.
    """

    @abc.abstractmethod
    def stderr_tail(self) -> list[str]:
        """The container's (or the runtime client's) last stderr lines, oldest first, at most a
        few dozen of bounded length: they explain a failed start."""


class RuntimeBackend(Protocol):
    """A container engine, driven through its API or its command line.

    Every method is bounded in time by the backend (a wedged engine raises RuntimeUnavailable
    instead of hanging its caller) and is safe to call concurrently.
    """

    name: str
    """The backend's name, e.g. ``podman-api``, ``docker-cli``, ``local-test-double``."""
    engine: str
    """``podman`` or ``docker`` (``local`` for the test double)."""

    async def create(self, spec: ContainerSpec) -> str:
        """Create (not start) a container for ``spec``; return its id.

        Raises ImageError when ``spec.image`` does not exist locally (no registry is ever
        contacted), RuntimeUnavailable for anything else the engine refuses.
        """
        ...

    async def attach(self, container: str) -> ContainerStream:
        """Attach to the created container's stdio, then start it (attaching first, so that no
        byte of output is lost), and return the stream. Raises RuntimeUnavailable."""
        ...

    async def stop(self, container: str, timeout: float = 0) -> None:
        """Stop the container: SIGTERM, then SIGKILL after ``timeout`` seconds (0: at once).
        A container that is already stopped or gone is fine."""
        ...

    async def remove(self, containers: list[str]) -> None:
        """Force-remove containers (killing running ones); ids or names that do not exist are
        ignored. Raises RuntimeUnavailable only if the engine cannot be reached."""
        ...

    async def inspect(self, container: str) -> ContainerInfo | None:
        """The container's state, exit code and OOM flag; None when it does not exist."""
        ...

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        """Containers (running or not) carrying all of ``labels`` (an empty value matches any
        value of that key); by default every kernelbridge container (``SESSION_LABEL``)."""
        ...

    async def info(self) -> RuntimeInfo:
        """Version, endpoint, rootless, cgroups and whether limits are enforced.
        Raises RuntimeUnavailable when the engine does not answer."""
        ...

    async def image_labels(self, image: str) -> dict[str, str] | None:
        """The labels of ``image``; None when no such image exists locally."""
        ...

    async def import_image(self, tarball: Path, tag: str, changes: list[str]) -> None:
        """Import a root file system tarball as image ``tag``, applying Containerfile-style
        ``changes`` (``ENV K=V``, ``WORKDIR /x``, ``CMD [...]``, ``LABEL k=v``). Raises ImageError."""
        ...

    async def tag_image(self, image: str, tag: str) -> None:
        """Add ``tag`` to ``image``. Raises ImageError."""
        ...

    async def list_images(self, repository: str) -> list[str]:
        """``repository:tag`` references of the images of ``repository``."""
        ...

    async def remove_image(self, image: str) -> bool:
        """Remove an image reference; False when it is still used by a container (kept)."""
        ...

    async def aclose(self) -> None:
        """Release the backend's connections (and any engine service it started itself)."""
        ...
