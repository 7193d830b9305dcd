"""The settings records: frozen dataclasses of every ``KERNELBRIDGE_*`` setting, with where each
comes from and why its default is what it is (read by :func:`kernelbridge.config.load_settings`).
No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kernelbridge.config.mounts import Mount
from kernelbridge.config.packages import PackageSettings, tmpfs_size

CLIENTS = ("claude-code", "claude-desktop", "cursor", "vscode")
"""The MCP clients whose config files the hub reads (``KERNELBRIDGE_CLIENT_CONFIGS``; see
:mod:`kernelbridge.hub.sources` for where each keeps its servers)."""

RUNTIMES = ("podman", "docker", "podman-api", "docker-api", "podman-cli", "docker-cli", "kube")
"""Values of ``KERNELBRIDGE_RUNTIME``: an engine (its API when one answers, else its CLI), or an
engine and a way to drive it, with no fallback; ``kube``: pods on a Kubernetes cluster."""

ImageProfile = Literal["full", "minimal"]
IMAGE_PROFILES: tuple[ImageProfile, ...] = ("full", "minimal")
"""Values of ``KERNELBRIDGE_IMAGE_PROFILE``: which of the recipe's package sets the sandbox image
holds (``kernelbridge.image.recipe.PROFILE_REQUIREMENTS`` names their files)."""
DEFAULT_IMAGE_PROFILE: ImageProfile = "full"
"""``Settings.image_profile``'s default, named once for the image module's records too."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits and hardening of one sandbox container (see DESIGN.md)."""

    memory: str = "512m"
    """Memory limit; swap is limited to the same value so the kernel cannot page out."""
    pids: int = 128
    """Maximum processes+threads in the container: stops fork bombs."""
    cpus: float = 1.0
    tmp_size: str = "64m"
    """Size of the /tmp tmpfs. Unsized, podman's /tmp is a huge tmpfs counted against memory."""
    workspace_size: str = "256m"
    packages_size: str = field(default_factory=lambda: tmpfs_size(PackageSettings().max_bytes))
    """Size of the /packages tmpfs where the session's ``%pip install``s go: the bytes that may be
    installed (``PackageSettings.max_bytes``) and half as much again for the wheel being unpacked
    (``config.packages.tmpfs_size``). Like every tmpfs it counts against ``memory``."""
    nofile: int = 1024
    nproc: int = 4096
    """RLIMIT_NPROC is per host uid, shared by every container running as 65534: keep it high
    and let ``pids`` bound each container."""
    user: str = "65534:65534"
    network: str = "none"
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Where the container engine API is (see ``kernelbridge.runtime``): read from the variables the
    docker and podman clients read, so an engine configured for them is found the same way."""

    urls: tuple[str, ...] = ()
    """``KERNELBRIDGE_ENGINES``: several engines (``unix://``, ``tcp://``, ``ssh://`` URLs, separated
    by commas or spaces); each new sandbox goes to the one running the fewest sandboxes."""
    docker_host: str | None = None
    """``DOCKER_HOST``: a docker engine (or a podman service speaking its API)."""
    container_host: str | None = None
    """``CONTAINER_HOST``: a podman service."""
    tls_verify: bool = False
    """``DOCKER_TLS_VERIFY``: talk TLS to ``tcp://`` engines, verify the engine against
    ``ca.pem`` and present ``cert.pem``/``key.pem`` from ``cert_path``."""
    tls: bool = False
    """``DOCKER_TLS``: TLS without verifying the engine's certificate (as docker's ``--tls``)."""
    cert_path: Path | None = None
    """``DOCKER_CERT_PATH`` (default ``~/.docker``)."""
    ssh_command: tuple[str, ...] = ("ssh",)
    """``KERNELBRIDGE_SSH_COMMAND``: the ssh client and options for ``ssh://`` engines (e.g.
    ``ssh -i ~/.ssh/engine_key``), split like a shell would; plain ``ssh`` reads ~/.ssh/config."""
    start_service: bool = True
    """Whether, when no engine answers, podman's API may be served by a ``podman system service``
    of our own. A bridge amortizes one over all its sandboxes; the tunnel process of a single
    plain-Jupyter kernel does not (it falls back to the CLI instead)."""


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """``KERNELBRIDGE_RUNTIME=kube``: sandboxes as pods of a cluster (docs/kubernetes.md)."""

    namespace: str = "kernelbridge"
    """``KERNELBRIDGE_KUBE_NAMESPACE``: the namespace the sandbox pods run in (it must exist, and
    should enforce Pod Security ``restricted``)."""
    runtime_class: str | None = None
    """``KERNELBRIDGE_KUBE_RUNTIME_CLASS``: a RuntimeClass for sandbox pods (``gvisor``, ``kata``)."""
    kubeconfig: Path | None = None
    """``KUBECONFIG`` (its first file); unset: ``~/.kube/config``, else the in-cluster service account."""
    image_loader: tuple[str, ...] = ()
    """``KERNELBRIDGE_KUBE_IMAGE_LOADER``: the command that loads a locally built image onto the
    cluster's nodes (the image appended), for ``kernelbridge image build``; e.g.
    ``scripts/kube-cluster.sh import``."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """``kernelbridge serve --http``: who may connect and how much each token may use."""

    tokens: tuple[str, ...] = field(default=(), repr=False)
    """``KERNELBRIDGE_HTTP_TOKENS``: comma-separated bearer tokens, each ``name:token`` or a bare
    token (parsed by :mod:`kernelbridge.server.http`; never shown in a repr)."""
    tokens_file: Path | None = None
    """``KERNELBRIDGE_HTTP_TOKENS_FILE``: one token per line, same forms. With neither, a token is
    generated at the first start and kept in ``<state dir>/http-token`` (mode 0600)."""
    allowed_hosts: tuple[str, ...] = ()
    """``KERNELBRIDGE_HTTP_ALLOWED_HOSTS``: Host header values accepted (``name``, ``name:port`` or
    ``name:*``); loopback names by default. Required for a non-loopback bind."""
    max_sessions: int = 4
    """``KERNELBRIDGE_HTTP_MAX_SESSIONS``: sessions one token may hold at once (the bridge's
    ``KERNELBRIDGE_MAX_SESSIONS`` still bounds them all together)."""
    max_calls: int = 4
    """``KERNELBRIDGE_HTTP_MAX_CALLS``: ``run_python`` calls of one token in flight at once."""
    disk_quota: int = 2 * 1024**3
    """``KERNELBRIDGE_HTTP_DISK_QUOTA``: bytes one token's files may take on the host (journals of
    all its sessions, old and live, exports, saved tools). Past it new sessions are not journalled
    and exports are refused: one token cannot fill the disk the others journal to."""


@dataclass(frozen=True, slots=True)
class Settings:
    """All kernelbridge settings. Build with :func:`load_settings`."""

    state_dir: Path
    runtime: str | None = None
    """One of :data:`RUNTIMES`; None picks an engine API that answers (podman's, then docker's),
    else the podman CLI, else the docker CLI."""
    image: str | None = None
    """Sandbox image reference; None means the locally built image of this version."""
    max_sessions: int = 8
    idle_timeout: float = 1800.0
    """Seconds after which an unused session's sandbox is closed; also how long a sandbox whose
    bridge has gone waits for another to adopt it before it ends itself."""
    durable: bool = True
    """``KERNELBRIDGE_DURABLE``: sessions outlive their bridge (a client restart, a crash, an
    upgrade): the sandbox runs on detached and the next bridge on this state directory adopts
    it. 0: sessions end with their bridge (no sandbox is left behind)."""
    auto_restore: bool = False
    """``KERNELBRIDGE_AUTO_RESTORE``: a session whose sandbox was lost (the machine restarted) is
    rebuilt from its journal by its next call, host tool calls answered from the recording, before
    that call's code runs; off: the call says so and offers ``restore=``."""
    detached_buffer: int = 32 * 1024 * 1024
    """``KERNELBRIDGE_DETACHED_BUFFER``: bytes of kernel output a detached sandbox holds for its
    next bridge (in the sandbox's own memory); past it the oldest output is dropped, counted."""
    warm_pool: int = 1
    """Pre-started sandboxes kept ready so a new session's first call skips the cold start."""
    default_timeout: float = 30.0
    max_timeout: float = 600.0
    max_task_time: float = 6 * 3600.0
    """``KERNELBRIDGE_MAX_TASK_TIME``: seconds a ``run_python`` cell run as an MCP task may take
    (its ``timeout`` defaults to this and may be up to it); past it the cell is interrupted as a
    timeout is."""
    output_limit: int = 20_000
    """Characters of output returned to the model per call (head and tail are kept)."""
    servers_config: tuple[Path, ...] = ()
    allow_servers: tuple[str, ...] = ()
    """``KERNELBRIDGE_ALLOW_SERVERS``: comma-separated host MCP server names (fnmatch wildcards
    allowed); when set, only matching servers can be granted or seen by sandboxed code.
    Empty: every configured server is allowed."""
    deny_servers: tuple[str, ...] = ()
    """``KERNELBRIDGE_DENY_SERVERS``: comma-separated server names or patterns hidden from
    sandboxed code and refused as grants; wins over ``allow_servers``."""
    deny_tools: tuple[str, ...] = ()
    """``KERNELBRIDGE_DENY_TOOLS``: comma-separated ``server.tool`` patterns (fnmatch wildcards,
    matched against the real names, e.g. ``github.delete_*`` or ``*.shell``). A denied tool is absent
    from every tool list and its calls answer ``denied``."""
    approve_tools: tuple[str, ...] = ()
    """``KERNELBRIDGE_APPROVE_TOOLS``: comma-separated ``server.tool`` patterns (as ``deny_tools``;
    ``*`` alone means every tool). A matching call from sandboxed code waits for a person's answer,
    asked through MCP elicitation of the client whose ``run_python`` runs the cell."""
    client_configs: tuple[str, ...] = CLIENTS
    """``KERNELBRIDGE_CLIENT_CONFIGS``: whose config files are searched for host servers: ``all``
    (default), ``none``, or some of :data:`CLIENTS` (comma-separated)."""
    project: Path | None = None
    """``KERNELBRIDGE_PROJECT`` (or ``--project``): a project directory whose MCP files (``.mcp.json``,
    ``.cursor/mcp.json``, ``.vscode/mcp.json``, Claude Code's local scope) are read too. Unset: none
    is, since a project directory is not trusted by default."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    kernel_start_timeout: float = 60.0
    image_budget: int = 50_000
    """``KERNELBRIDGE_IMAGE_BUDGET``: base64 characters of one image sent to the model; a bigger
    image arrives downscaled, its original kept as a resource (see ``server/images.py``)."""
    journal_budget: int = 64 * 1024 * 1024
    """``KERNELBRIDGE_JOURNAL_BUDGET``: bytes one session's journal may hold (``64m``, ``1g`` or a
    number of bytes). Past it the journal gets one ``truncated`` line and nothing more, so no
    sandbox can fill the host's disk; the default keeps every journal restorable and replayable
    (``kernelbridge replay`` reads notebooks of up to 64 MiB)."""
    history_budget: int = 1024**3
    """``KERNELBRIDGE_HISTORY_BUDGET``: bytes the old generations of sessions (journals and records
    of sessions no longer live) may take in the state directory. Nothing is removed on its own:
    past it the bridge says so when it starts, and ``kernelbridge prune`` removes the oldest."""
    export_dir: Path | None = None
    """``KERNELBRIDGE_EXPORT_DIR``: where ``export_notebook(path=...)`` may write (default
    ``<state_dir>/exports``); a model's export never leaves this directory."""
    labels: tuple[tuple[str, str], ...] = ()
    """``KERNELBRIDGE_LABELS``: extra ``key=value`` labels (comma-separated) on every sandbox
    container, e.g. to tell an operator's bridges apart on a shared engine."""
    engine: EngineSettings = field(default_factory=EngineSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    image_packages: tuple[str, ...] = ()
    """``KERNELBRIDGE_IMAGE_PACKAGES``: comma-separated Python packages added to the sandbox image
    (``kernelbridge image build`` installs them; the image's name covers them)."""
    image_requirements: Path | None = None
    """``KERNELBRIDGE_IMAGE_REQUIREMENTS``: a requirements file of more packages for the image."""
    image_profile: ImageProfile = DEFAULT_IMAGE_PROFILE
    """``KERNELBRIDGE_IMAGE_PROFILE``: ``full``, the recipe's data and analysis stack (scipy,
    scikit-learn, statsmodels, pyarrow...: ~0.9 GB); ``minimal``, only what the sandbox API and a
    notebook's basics need (ipykernel, numpy, pandas, matplotlib, pillow): a smaller image that
    builds faster. Like the extra packages, the profile is part of the image's name."""
    allow_unlimited: bool = False
    """``KERNELBRIDGE_ALLOW_UNLIMITED=1``: start sandboxes even where the runtime ignores the memory
    and pid limits (rootless podman on cgroup v1); the model is told they are unlimited."""
    namespace: str = ""
    """The HTTP client (token) this registry serves; empty over stdio. Set by the server, not read
    from the environment: it goes into container names and labels."""
    disk_quota: int | None = None
    """Bytes this namespace's files may take (``HttpSettings.disk_quota`` for a token's namespace;
    None: no quota, the shared namespace). Set by the server, like ``namespace``."""
    http: HttpSettings = field(default_factory=HttpSettings)
    packages: PackageSettings = field(default_factory=PackageSettings)
    mounts: tuple[Mount, ...] = ()
    """``KERNELBRIDGE_MOUNTS`` and ``serve --mount``: host directories every sandbox sees read-only."""
    problems: tuple[str, ...] = ()
    """Settings that could not be read, one line each (the variable, its value, what is expected),
    from ``load_settings(strict=False)``; each such setting has its default. While there are any,
    ``serve`` starts no sandbox (every call says them) and ``doctor`` fails."""

    @property
    def packages_dir(self) -> Path:
        """The wheel cache shared by every session on this state directory."""
        return self.state_dir / "packages"

    @property
    def sessions_dir(self) -> Path:
        return self.state_dir / "sessions"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def connections_dir(self) -> Path:
        """Kernel connection files (mode 0600, in a 0700 directory)."""
        return self.state_dir / "connections"

    @property
    def run_dir(self) -> Path:
        """Working directory of tunnel processes and the runtime helpers they start."""
        return self.state_dir / "run"
