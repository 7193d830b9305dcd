"""The container runtime seam: what a sandbox needs from a container engine, as streams and records.

Nothing above this package spawns a runtime CLI or speaks an engine API: everything talks to
:class:`RuntimeBackend` (the containers) and its ``images``, an :class:`ImageStore` on the same
connection; only ``runtime/select.py`` branches on runtime names. Backends subclass them explicitly,
so a missing or misspelt verb fails at the definition. Errors (:mod:`kernelbridge.errors`, translated
inside ``runtime/`` only): RuntimeUnavailable, one line (EngineRefused when the engine API answered
with an error status); ImageError for a missing image or a failed image chore. Design:
docs/design/runtime.md.
"""

from __future__ import annotations

import abc
import builtins
import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from anyio.abc import ByteStream

from kernelbridge.config import Mount, SandboxLimits

SESSION_LABEL = "kernelbridge.session"
OWNER_LABEL = "kernelbridge.owner"
"""Label holding the pid of the bridge process that owns the container: used to find orphans."""
HOST_LABEL = "kernelbridge.host"
"""Label holding the host name of the owning bridge: an engine shared by several machines must
not let one bridge reap another machine's containers because a pid happens to be unused here."""
DURABLE_LABEL = "kernelbridge.durable"
"""On a sandbox that outlives its bridge (``1``): a later bridge may adopt it while it runs, so
the orphan reaper leaves it alone until it has ended (it ends itself after its idle timeout)."""
OWNER_START_LABEL = "kernelbridge.owner-start"
"""When the owner bridge process started (``reaper.process_start``): with its pid (``OWNER_LABEL``),
one process for the machine's uptime, so a later process given the same pid is not taken for it."""
STATE_LABEL = "kernelbridge.state"
"""On a durable sandbox: the identity of the state directory whose bridges may adopt it (a hash of
the host name and the directory's path, never the path; ``host.container.state_identity``)."""
AGENT_LABEL = "kernelbridge.agent-hash"
"""The hash of the agent the sandbox runs: its image's own label (podman and docker copy an image's
labels onto its containers), and set again from :attr:`ContainerSpec.agent_hash` for runtimes
that do not (Kubernetes). A later bridge reaches a sandbox only if it runs that bridge's agent:
reaching it runs the image's handover, and the agent speaks the frames of its own version."""
MOUNTS_LABEL = "kernelbridge.mounts"
"""A digest of the host directories the sandbox sees (:attr:`ContainerSpec.mounts_shape`): a
later bridge whose settings share other ones (a mount taken away) does not take its session over,
so that a directory no longer shared is not seen any more."""
SHAPE_LABEL = "kernelbridge.shape"
"""A digest of what the sandbox was made with (:attr:`ContainerSpec.shape`): its image, limits,
mounts, environment, command, agent and labels. A warm sandbox a bridge before left is pooled
again only by a bridge that would start the same (an image rebuilt with other packages, whose tag
names its contents, a mount taken away, a lower memory limit: each makes another)."""


def _digest(value: object) -> str:
    """A short digest of ``value``'s repr (frozen dataclasses and tuples of them: stable)."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Everything needed to create one sandbox container (see DESIGN.md for the flags; the backends
    render them from :func:`kernelbridge.runtime.flags.sandbox_flags`)."""

    image: str
    name: str
    session: str
    owner_pid: int
    owner_host: str = ""
    owner_start: int | None = None
    """When the owner process started (:data:`OWNER_START_LABEL`); None: not said."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env: tuple[tuple[str, str], ...] = ()
    """Extra variables for the kernel; nothing of the host's environment enters by default."""
    command: tuple[str, ...] = ()
    """Overrides the image's CMD (the agent) when not empty."""
    labels: tuple[tuple[str, str], ...] = ()
    """Labels beyond the session/owner/host ones."""
    mounts: tuple[Mount, ...] = ()
    """Host directories bound read-only into the sandbox (checked by ``config.check_mount``); one
    on ``/workspace`` (a notebook's own directory, for a plain Jupyter client) replaces its tmpfs."""
    agent_hash: str = ""
    """The agent the bridge expects in the image (:data:`AGENT_LABEL`); empty: not said."""
    durable: bool = False
    """The sandbox may outlive its bridge (:data:`DURABLE_LABEL`): a later bridge reaches it with
    :meth:`RuntimeBackend.attach_exec`. Its stdin is still open for one attachment only (the
    agent sees EOF when its first bridge goes, and waits for another). Once it ends the engine
    removes it (no bridge may be there to); :meth:`RuntimeBackend.ended` still tells how it ended.
    Backends whose :attr:`RuntimeInfo.reattach` is False refuse a durable spec."""

    @property
    def shape(self) -> str:
        """A digest of everything the sandbox is made with but its name and owner (whose it is,
        not what it is): two specs of one shape make interchangeable sandboxes."""
        return _digest(
            (
                self.image,
                self.limits,
                self.env,
                self.command,
                self.labels,
                self.mounts,
                self.agent_hash,
                self.durable,
            )
        )

    @property
    def mounts_shape(self) -> str:
        """A digest of :attr:`mounts` (of none, too: a label always there)."""
        return _digest(self.mounts)

    def all_labels(self) -> dict[str, str]:
        labels = {
            SESSION_LABEL: self.session,
            OWNER_LABEL: str(self.owner_pid),
            SHAPE_LABEL: self.shape,
            MOUNTS_LABEL: self.mounts_shape,
        }
        if self.owner_host:
            labels[HOST_LABEL] = self.owner_host
        if self.owner_start is not None:
            labels[OWNER_START_LABEL] = str(self.owner_start)
        if self.durable:
            labels[DURABLE_LABEL] = "1"
        if self.agent_hash:
            labels[AGENT_LABEL] = self.agent_hash
        labels.update(self.labels)
        return labels


class ContainerState(enum.Enum):
    """Where a container is in its life, as the engine reports it."""

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    """Stopped (exited, or killed); ``exit_code`` and ``oom_killed`` say how."""
    STOPPING = "stopping"
    """podman: being stopped; its process has not ended yet."""
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
    reason: str = ""
    """Why the runtime itself ended it, in one line, when it did (a cluster evicting or deleting
    a pod); empty when the container ended on its own or the runtime does not say."""

    @property
    def owner_pid(self) -> int | None:
        raw = self.labels.get(OWNER_LABEL, "")
        return int(raw) if raw.isdigit() else None

    @property
    def owner_start(self) -> int | None:
        raw = self.labels.get(OWNER_START_LABEL, "")
        return int(raw) if raw.isdigit() else None

    @property
    def owner_host(self) -> str:
        return self.labels.get(HOST_LABEL, "")

    @property
    def session(self) -> str:
        return self.labels.get(SESSION_LABEL, "")

    @property
    def durable(self) -> bool:
        return self.labels.get(DURABLE_LABEL) == "1"

    @property
    def agent_hash(self) -> str:
        """The agent it runs (:data:`AGENT_LABEL`; empty: not said)."""
        return self.labels.get(AGENT_LABEL, "")

    @property
    def shape(self) -> str:
        """What it was made with (:data:`SHAPE_LABEL`; empty: not said, e.g. a sandbox of an
        earlier kernelbridge)."""
        return self.labels.get(SHAPE_LABEL, "")

    @property
    def mounts_shape(self) -> str:
        """The host directories it sees (:data:`MOUNTS_LABEL`; empty: not said)."""
        return self.labels.get(MOUNTS_LABEL, "")


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """What ``doctor``, ``setup`` and the capabilities text need to know about an engine."""

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
    storage_driver: str = ""
    """The engine's image storage driver (``overlay``, ``vfs``, ``overlay2``...); empty if unknown.
    ``vfs`` copies the whole image for every container: seconds per sandbox start."""
    reattach: bool = False
    """Whether a running container can be attached to again (:meth:`RuntimeBackend.attach_exec`),
    so that sandboxes may outlive their bridge (:attr:`ContainerSpec.durable`): the engine API
    backends; not the CLI fallback."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """One image as an engine lists it."""

    id: str
    tags: tuple[str, ...]
    """``repository:tag`` references; empty for a dangling image (untagged by a rebuild)."""
    created: float
    """When the image was made, in seconds since the epoch (0 if the engine did not say)."""
    labels: dict[str, str] = field(default_factory=dict)

    def in_repository(self, repository: str) -> bool:
        """Whether one of the image's tags is of ``repository`` (``localhost/kernelbridge-sandbox``)."""
        return any(tag.rpartition(":")[0] == repository for tag in self.tags)


def loaded_references(said: str) -> list[str]:
    """The references in what an engine (its CLI or its API) says after loading an archive:
    ``Loaded image: a:1``, ``Loaded image(s): a:1,b:2`` (podman), ``Loaded image ID: sha256:..``
    (docker, for an untagged image)."""
    found: list[str] = []
    for line in said.splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip().lower() in ("loaded image", "loaded image(s)", "loaded image id"):
            found += [ref.strip() for ref in rest.split(",") if ref.strip()]
    return list(dict.fromkeys(found))


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


class ImageStore(Protocol):
    """The images of one engine (or of every engine of a set), on the runtime's own connection.

    Every method is bounded in time by the backend. Image references are the engines' own
    (``localhost/kernelbridge-sandbox:0123abcd``, an id). No registry is ever contacted.
    """

    async def labels(self, image: str) -> dict[str, str] | None:
        """The labels of ``image`` ({} for an image without labels); None when there is no such
        image. Raises RuntimeUnavailable when the engine cannot be asked."""
        ...

    async def import_rootfs(self, tarball: Path, tag: str, changes: Sequence[str]) -> None:
        """Import a root file system tarball as image ``tag``, applying Containerfile-style
        ``changes`` (``ENV K=V``, ``WORKDIR /x``, ``CMD [...]``, ``LABEL k=v``). Raises ImageError."""
        ...

    async def tag(self, image: str, tag: str) -> None:
        """Add ``tag`` to ``image``. Raises ImageError."""
        ...

    async def list(
        self, repository: str | None = None, *, labels: Mapping[str, str] | None = None
    ) -> list[ImageInfo]:
        """Images carrying all of ``labels`` (an empty value matches any value of that key) and,
        when ``repository`` is given, a tag of that repository (``localhost/kernelbridge-sandbox``).
        Dangling images are listed only without ``repository``."""
        ...

    async def remove(self, image: str) -> bool:
        """Remove an image reference (a tag, or the id of an untagged image); True when it is
        gone (or was not there), False when a container still uses it (kept)."""
        ...

    async def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: str = "Containerfile",
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        """Build image ``tag`` from ``context/containerfile`` with ``build_args``. A base image that
        exists on the engine is used as it is (nothing is pulled for it). Raises ImageError with
        the build's last words."""
        ...

    async def save(self, image: str, archive: Path) -> None:
        """Write ``image`` (a tag: it is kept in the file) to the file ``archive`` as a
        docker-archive tarball (what ``docker save`` / ``podman save`` write). Raises ImageError;
        a partial file may be left (the caller writes beside its target and renames)."""
        ...

    async def load(self, archive: Path) -> builtins.list[str]:
        """Load the images of the docker-archive tarball ``archive`` (it is not checked here: the
        caller inspects it first); the references the engine says it loaded (tags, or ids for
        untagged images). Raises ImageError."""
        ...


class RuntimeBackend(Protocol):
    """A container engine, driven through its API or its command line.

    Every method is bounded in time by the backend (a wedged engine raises RuntimeUnavailable
    instead of hanging its caller) and is safe to call concurrently.
    """

    name: str
    """The backend's name, e.g. ``podman-api``, ``docker-cli``, ``local-test-double``."""
    engine: str
    """``podman`` or ``docker`` (``local`` for the test double)."""
    images: ImageStore
    """The images of this engine, on the same connection."""

    async def create(self, spec: ContainerSpec) -> str:
        """Create (not start) a container for ``spec``; return its id.

        Raises ImageError when ``spec.image`` does not exist locally (no registry is ever
        contacted), RuntimeUnavailable for anything else the engine refuses.
        """
        ...

    async def attach(self, container: str) -> ContainerStream:
        """Attach to the container's stdio and return the stream; start it if it was created and
        not started yet (attaching first, so that no byte of its output is lost). A container that
        has exited is never run again. The container's stdin is open for one attachment: closing
        that stream closes it for good (a running container is reached again with
        :meth:`attach_exec`).

        Raises RuntimeUnavailable (also for a container that is gone or has exited)."""
        ...

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        """Run ``command`` in the running ``container`` as ``user`` (an exec session), in
        ``workdir``, and return its stdin and stdout as a stream (its stderr kept as the stream's
        tail). Its environment is the container's with ``env`` set over it (an engine merges: a
        variable can be overridden, not removed). The session ends when the command exits;
        closing the stream closes the command's stdin.

        Raises RuntimeUnavailable when the container is not running (gone, exited) or the engine
        refuses, and on backends whose :attr:`RuntimeInfo.reattach` is False."""
        ...

    async def remove(self, containers: list[str]) -> None:
        """Force-remove containers (killing running ones); ids or names that do not exist, or
        that another client removed meanwhile, are ignored. Every container is tried; raises
        RuntimeUnavailable afterwards if the engine cannot be reached or kept any of them."""
        ...

    async def inspect(self, container: str) -> ContainerInfo | None:
        """The container's state, exit code and OOM flag; None when it does not exist."""
        ...

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        """Containers (running or not) carrying all of ``labels`` (an empty value matches any
        value of that key); by default every kernelbridge container (``SESSION_LABEL``). A
        container being removed meanwhile does not fail the listing."""
        ...

    async def ended(self, container: str) -> ContainerInfo | None:
        """How the container ``container`` (an id) ended, from the engine's own record of it
        (its event log): exited, its exit code and labels, when the engine removed it afterwards
        (a durable sandbox that ended itself). None when the engine kept no such record (no
        event log, or it was dropped). Bounded; never raises: it only adds detail to a reason.

        A backend without an event log (the test double) keeps this default."""
        return None

    async def info(self) -> RuntimeInfo:
        """Version, endpoint, rootless, cgroups, storage and whether limits are enforced.
        Raises RuntimeUnavailable when the engine does not answer."""
        ...

    async def aclose(self) -> None:
        """Release the backend's connections (and any engine service it started itself)."""
        ...
