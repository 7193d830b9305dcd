"""The command-line backend: ``podman`` or ``docker`` driven through their CLI (the fallback).

Every operation is one bounded CLI call, except ``attach``: ``<cli> start --attach --interactive
<id>``, a client process that lives as long as the sandbox and carries its stdio. No sandbox
outlives its bridge here: ``RuntimeInfo.reattach`` is False, a durable spec and ``attach_exec`` are
refused (why: docs/design/runtime.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import (
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    ImageStore,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.cli.command import Cli, container_gone, image_missing
from kernelbridge.runtime.cli.images import CliImages
from kernelbridge.runtime.cli.stream import ProcessStream, StderrDrains
from kernelbridge.runtime.events import died
from kernelbridge.runtime.flags import sandbox_flags, unsupported
from kernelbridge.runtime.info_store import InfoCache, InfoStore
from kernelbridge.runtime.races import half_removed, process_ended, retrying

ATTACH_TIMEOUT = 10.0
ATTACH_POLL = 0.02
"""How often a freshly attached container is checked until its client has started it."""
REMOVE_ATTEMPTS = 3
REMOVE_RETRY_DELAY = 0.5
EVENTS_TIMEOUT = 15.0
"""Bound of asking the CLI for a removed container's events (see ``EngineRuntime.ended``): a
`podman events` process to start and its whole events file to read, seconds on a busy host."""


def container_flags(spec: ContainerSpec) -> list[str]:
    """The sandbox flags of ``spec`` for ``create`` (both CLIs accept them)."""
    flags = sandbox_flags(spec)
    argv = [
        "--pull", "always" if flags.pull else "never",
        "--name", flags.name,
        "--network", flags.network,
        *(arg for cap in flags.cap_drop for arg in ("--cap-drop", cap)),
        *(["--security-opt", "no-new-privileges"] if flags.no_new_privileges else []),
        "--user", flags.user,
        "--memory", flags.memory,
        "--memory-swap", flags.memory,
        "--pids-limit", str(flags.pids),
        "--cpus", f"{flags.cpus:g}",
        *(arg for mount in flags.tmpfs for arg in ("--tmpfs", f"{mount.path}:{mount.options}")),
        *(arg for b in flags.binds for arg in ("--volume", f"{b.source}:{b.target}:{','.join(b.options)}")),
        "--workdir", flags.workdir,
        *(arg for u in flags.ulimits for arg in ("--ulimit", f"{u.name}={u.soft}:{u.hard}")),
        "--log-driver", flags.log_driver,
    ]  # fmt: skip
    if flags.read_only:
        argv.append("--read-only")
    if flags.init:
        argv.append("--init")
    if flags.auto_remove:
        argv.append("--rm")
    for key, value in flags.labels.items():
        argv += ["--label", f"{key}={value}"]
    for key, value in flags.env:
        argv += ["--env", f"{key}={value}"]
    return argv


@dataclass
class CliRuntime(RuntimeBackend):
    """podman or docker through the CLI. Use as an async context manager: it owns the task group
    that drains the stderr of each attached client."""

    engine: str = "podman"
    executable: str = "podman"
    oci_runtime: str | None = None
    """podman's ``--runtime`` to force (e.g. ``runc`` where crun fails on hybrid cgroups)."""
    workdir: Path | None = None
    """Working directory of the CLI processes (see ``command.Cli.workdir``)."""
    info_store: InfoStore | None = None
    """Where podman's info may be kept for this user's other processes (the selection says
    whether this CLI speaks to this machine's podman); None: asked in each process."""
    name: str = field(init=False)
    images: ImageStore = field(init=False, repr=False)
    cli: Cli = field(init=False, repr=False)
    _drains: StderrDrains = field(default_factory=StderrDrains, init=False, repr=False)
    _never_started: set[str] = field(default_factory=set, init=False, repr=False)
    """Ids this backend created and has not attached to: ``attach`` starts them without asking."""
    _info: InfoCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = f"{self.engine}-cli"
        self.cli = Cli(self.engine, self.executable, self.workdir)
        self.images = CliImages(self.cli)
        store = self.info_store
        self._info = InfoCache(store.with_backend(self.name, self.executable) if store is not None else None)

    async def __aenter__(self) -> CliRuntime:
        await self._drains.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._drains.aclose()

    # -- containers ----------------------------------------------------------------------------
    def create_argv(self, spec: ContainerSpec) -> list[str]:
        argv = [self.executable, "create", "--interactive", *container_flags(spec)]
        if self.oci_runtime:
            argv += ["--runtime", self.oci_runtime]
        return [*argv, spec.image, *spec.command]

    async def create(self, spec: ContainerSpec) -> str:
        if spec.durable:
            raise RuntimeUnavailable(
                f"the {self.engine} CLI backend keeps no sandbox beyond its bridge;"
                f" use the engine API (KERNELBRIDGE_RUNTIME={self.engine}-api)"
            )
        if (why := unsupported(self.engine, sandbox_flags(spec))) is not None:
            raise RuntimeUnavailable(why)
        try:
            container = (await self.cli.run(*self.create_argv(spec)[1:])).strip().splitlines()[-1]
        except RuntimeUnavailable as exc:
            if image_missing(exc):
                raise ImageError(
                    f"the sandbox image {spec.image} is missing; run `kernelbridge image build`"
                ) from None
            raise
        self._never_started.add(container)
        return container

    async def attach(self, container: str) -> ContainerStream:
        if not self._drains.is_open:
            raise RuntimeError("CliRuntime.attach outside `async with`")
        if container in self._never_started:
            self._never_started.discard(container)
        else:
            # `start --attach` would run an exited container again, and cannot attach a second
            # client to a running one: the CLI attaches to created containers only.
            info = await self.inspect(container)
            if info is None or info.state is not ContainerState.CREATED:
                why = "does not exist" if info is None else f"is {info.state.value}"
                raise RuntimeUnavailable(
                    f"cannot attach to {container}: it {why} (the {self.engine} CLI attaches to a"
                    " container once, before it starts)"
                )
        argv = [self.executable, "start", "--attach", "--interactive", container]
        try:
            process = await anyio.open_process(argv, stdin=-1, stdout=-1, stderr=-1, cwd=self.cli.cwd())
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot run {self.executable}: {exc.strerror}") from None
        stream = ProcessStream(process)
        self._drains.drain(stream)
        await self._wait_started(container, process)
        return stream

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        raise RuntimeUnavailable(
            f"the {self.engine} CLI backend cannot attach to a running sandbox again;"
            f" use the engine API (KERNELBRIDGE_RUNTIME={self.engine}-api)"
        )

    async def _wait_started(self, container: str, process: anyio.abc.Process) -> None:
        """Return once the client has really started the container (or given up). ``start -ai``
        attaches before it starts: a removal landing in between finds a created container, and
        the client would then start it anyway (a race seen with both podman and docker)."""
        with anyio.move_on_after(ATTACH_TIMEOUT):
            while process.returncode is None:
                info = await self.inspect(container)
                if info is None or info.state is not ContainerState.CREATED:
                    return
                await anyio.sleep(ATTACH_POLL)

    async def remove(self, containers: list[str]) -> None:
        self._never_started.difference_update(containers)
        if not containers:
            return
        extra = ["--ignore", "--time", "0"] if self.engine == "podman" else []
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                await self.cli.run("rm", "--force", *extra, *containers)
                return
            except RuntimeUnavailable as exc:
                if container_gone(exc):
                    return
                if attempt == REMOVE_ATTEMPTS - 1:
                    if await self._all_gone(containers):
                        return  # another client removed them meanwhile: what we asked for
                    raise
                # A container that is stopping on its own ("container state improper") cannot
                # be killed for a moment; once stopped it can be removed.
                await anyio.sleep(REMOVE_RETRY_DELAY)

    async def _all_gone(self, containers: list[str]) -> bool:
        try:
            return all([await self.inspect(c) is None for c in containers])
        except RuntimeUnavailable:
            return False

    async def inspect(self, container: str) -> ContainerInfo | None:
        async def ask() -> str:
            return await self.cli.run("container", "inspect", container)

        try:
            text = await retrying(ask, f"`{self.engine} inspect`", when=process_ended)
        except RuntimeUnavailable as exc:
            if container_gone(exc) or half_removed(exc):
                return None
            raise
        rows = json.loads(text or "[]")
        return _inspected(rows[0]) if rows else None

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        args = ["ps", "--all", "--no-trunc", "--format", "{{json .}}"]
        for key, value in (labels or {SESSION_LABEL: ""}).items():
            args += ["--filter", f"label={key}={value}" if value else f"label={key}"]

        async def ask() -> list[ContainerInfo]:
            return parse_ps_output(await self.cli.run(*args))

        return await retrying(ask, f"`{self.engine} ps`")

    async def ended(self, container: str) -> ContainerInfo | None:
        # podman filters on "died" and prints its own JSON; docker filters on "die".
        if self.engine == "podman":
            # Not `--until`: podman stops reading its events file at once when that moment has
            # passed by the time it starts (a second's margin is not enough on a busy host).
            # `--stream=false` is hidden ("for testing only") but there from podman 1 to 5.
            args = ["--stream=false", "--filter", "event=died", "--format", "json"]
        else:
            until = str(int(time.time()) + 1)  # the answer ends instead of streaming
            args = ["--until", until, "--filter", "event=die", "--format", "{{json .}}"]
        try:
            text = await self.cli.run(
                "events", "--since", "1", "--filter", f"container={container}", *args, timeout=EVENTS_TIMEOUT
            )
        except RuntimeUnavailable:
            return None
        found = None
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if (info := died(row, container)) is not None:
                found = info
        return found

    async def info(self) -> RuntimeInfo:
        """The engine's facts, asked again once ``INFO_TTL`` has passed (:class:`InfoCache`)."""
        return await self._info.get(self._ask_info)

    async def _ask_info(self) -> RuntimeInfo:
        version = (await self.cli.run("--version")).strip()
        if self.engine != "podman":
            data = json.loads(await self.cli.run("info", "--format", "{{json .}}"))
            return RuntimeInfo(
                name=self.name,
                engine=self.engine,
                version=f"{version}; engine {data.get('ServerVersion', '?')}",
                endpoint=self.executable,
                rootless="rootless" in str(data.get("SecurityOptions", "")),
                cgroup_version=f"v{data.get('CgroupVersion', '?')}",
                oci_runtime=str(data.get("DefaultRuntime", "")),
                storage_driver=str(data.get("Driver") or ""),
            )
        data = json.loads(await self.cli.run("info", "--format", "json"))
        host = data.get("host", {})
        rootless = bool(host.get("security", {}).get("rootless"))
        cgroups = str(host.get("cgroupVersion", "?"))
        return RuntimeInfo(
            name=self.name,
            engine=self.engine,
            version=version,
            endpoint=self.executable,
            rootless=rootless,
            cgroup_version=cgroups,
            oci_runtime=self.oci_runtime or str(host.get("ociRuntime", {}).get("name", "")),
            limits_enforced=not (rootless and cgroups == "v1"),
            storage_driver=str((data.get("store") or {}).get("graphDriverName") or ""),
        )


_STATES = {state.value: state for state in ContainerState}


def _state(raw: Any) -> ContainerState:
    text = str(raw or "").lower()
    if text in ("stopped", "dead"):  # podman's spellings
        return ContainerState.EXITED
    if text in ("configured", "initialized"):
        return ContainerState.CREATED
    return _STATES.get(text, ContainerState.UNKNOWN)


def _inspected(row: dict[str, Any]) -> ContainerInfo:
    state = row.get("State") or {}
    labels = (row.get("Config") or {}).get("Labels") or {}
    code = state.get("ExitCode")
    return ContainerInfo(
        id=str(row.get("Id", "")),
        name=str(row.get("Name", "")).lstrip("/"),
        labels={str(k): str(v) for k, v in labels.items()},
        state=_state(state.get("Status")),
        exit_code=code if isinstance(code, int) else None,
        oom_killed=bool(state.get("OOMKilled")),
    )


def parse_ps_output(text: str) -> list[ContainerInfo]:
    """Output of ``ps --format '{{json .}}'``: podman prints one JSON array, docker one object
    per line, and they spell some fields differently."""
    text = text.strip()
    if not text:
        return []
    rows = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()]
    return [_listed(row) for row in rows]


def _listed(row: dict[str, Any]) -> ContainerInfo:
    labels = row.get("Labels") or {}
    if isinstance(labels, str):  # docker: "k=v,k2=v2"
        labels = dict(item.partition("=")[::2] for item in labels.split(",") if item)
    names = row.get("Names")
    name = names[0] if isinstance(names, list) and names else str(names or "")
    return ContainerInfo(
        id=str(row.get("Id") or row.get("ID") or ""),
        name=name,
        labels={str(k): str(v) for k, v in labels.items()},
        state=_state(row.get("State")),
    )
