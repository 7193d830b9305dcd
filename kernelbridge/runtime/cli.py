"""The command-line backend: ``podman`` or ``docker`` driven through their CLI (the fallback).

Every operation is one bounded CLI call, except ``attach``: it starts ``<cli> start --attach
--interactive <id>``, a client process that lives as long as the sandbox and carries its stdio
(the engine-API backend needs no such process). The container's flags are the DESIGN.md set; the
two CLIs agree on them except the log driver and podman's ``--runtime``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import (
    READ_ONLY_TMPFS,
    SESSION_LABEL,
    WORKDIR,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.streams import ProcessStream

# Why 30 s: `podman ps`/`rm` answer in well under a second here, but a busy machine starting 20
# sandboxes at once can stall the client for several seconds. Past this the runtime is wedged.
CLI_TIMEOUT = 30.0
IMPORT_TIMEOUT = 600.0
"""An image import copies hundreds of MB."""
ATTACH_TIMEOUT = 10.0
ATTACH_POLL = 0.02
"""How often a freshly attached container is checked until its client has started it."""
REMOVE_ATTEMPTS = 3
REMOVE_RETRY_DELAY = 0.5
_MISSING_IMAGE = ("image not known", "no such image", "unable to find image", "not found: image")


def container_flags(spec: ContainerSpec) -> list[str]:
    """The DESIGN.md sandbox flags for ``create`` (both CLIs accept them)."""
    lim = spec.limits
    flags = [
        # Never reach for a registry: the image is built locally, and a miss must fail fast.
        "--pull", "never",
        "--name", spec.name,
        "--network", lim.network,
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--user", lim.user,
        "--memory", lim.memory,
        "--memory-swap", lim.memory,
        "--pids-limit", str(lim.pids),
        "--cpus", f"{lim.cpus:g}",
        # Sized tmpfs: unsized, --read-only gives a huge /tmp counted against the memory limit.
        "--tmpfs", f"/tmp:rw,size={lim.tmp_size},mode=1777,nosuid,nodev",
        "--tmpfs", f"{WORKDIR}:rw,size={lim.workspace_size},mode=1777,nosuid,nodev",
        "--workdir", WORKDIR,
        # Explicit ulimits: the defaults would be raised past what we may set without
        # CAP_SYS_RESOURCE on these machines, and the container would fail to start.
        "--ulimit", f"nofile={lim.nofile}:{lim.nofile}",
        "--ulimit", f"nproc={lim.nproc}:{lim.nproc}",
        # Nothing reads the engine's log of a sandbox: its stdio goes to the tunnel only, and a
        # log driver would write every byte the kernel prints to the host's disk.
        "--log-driver", "none",
    ]  # fmt: skip
    if lim.read_only:
        flags.append("--read-only")
        # podman's --read-only also mounts *unsized* tmpfs on /run and /var/tmp
        # (--read-only-tmpfs, on by default): writable space bounded by nothing but the memory
        # limit, where nobody looks. Mounting them read-only ourselves replaces podman's mounts
        # and says the same thing to docker (which adds none) and to the engine API (HostConfig.Tmpfs).
        flags += ["--tmpfs", f"/var/tmp:{READ_ONLY_TMPFS}", "--tmpfs", f"/run:{READ_ONLY_TMPFS}"]
    for key, value in spec.all_labels().items():
        flags += ["--label", f"{key}={value}"]
    for key, value in spec.env:
        flags += ["--env", f"{key}={value}"]
    return flags


@dataclass
class CliRuntime(RuntimeBackend):
    """podman or docker through the CLI. Use as an async context manager: it owns the task group
    that drains the stderr of each attached client."""

    engine: str = "podman"
    executable: str = "podman"
    oci_runtime: str | None = None
    """podman's ``--runtime`` to force (e.g. ``runc`` where crun fails on hybrid cgroups)."""
    workdir: Path | None = None
    """Working directory of the CLI processes: podman's conmon drops an ``oom`` file in its working
    directory after an OOM kill, which must not land wherever the bridge was started."""
    name: str = field(init=False)
    _tg: anyio.abc.TaskGroup | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = f"{self.engine}-cli"

    async def __aenter__(self) -> CliRuntime:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._tg is not None:
            tg, self._tg = self._tg, None
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    # -- containers ----------------------------------------------------------------------------
    def create_argv(self, spec: ContainerSpec) -> list[str]:
        argv = [self.executable, "create", "--interactive", *container_flags(spec)]
        if self.oci_runtime:
            argv += ["--runtime", self.oci_runtime]
        return [*argv, spec.image, *spec.command]

    async def create(self, spec: ContainerSpec) -> str:
        try:
            return (await self._cli(*self.create_argv(spec)[1:])).strip().splitlines()[-1]
        except RuntimeUnavailable as exc:
            if any(marker in str(exc).lower() for marker in _MISSING_IMAGE):
                raise ImageError(
                    f"the sandbox image {spec.image} is missing; run `kernelbridge image build`"
                ) from None
            raise

    async def attach(self, container: str) -> ContainerStream:
        if self._tg is None:
            raise RuntimeError("CliRuntime.attach outside `async with`")
        argv = [self.executable, "start", "--attach", "--interactive", container]
        try:
            process = await anyio.open_process(argv, stdin=-1, stdout=-1, stderr=-1, cwd=self._cwd())
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot run {self.executable}: {exc.strerror}") from None
        stream = ProcessStream(process)
        self._tg.start_soon(stream.drain_stderr)
        await self._wait_started(container, process)
        return stream

    async def _wait_started(self, container: str, process: anyio.abc.Process) -> None:
        """Return once the client has really started the container (or given up). ``start -ai``
        attaches before it starts: a ``stop`` landing in between finds a created container, and
        the client would then start it anyway (a race seen with both podman and docker)."""
        with anyio.move_on_after(ATTACH_TIMEOUT):
            while process.returncode is None:
                info = await self.inspect(container)
                if info is None or info.state is not ContainerState.CREATED:
                    return
                await anyio.sleep(ATTACH_POLL)

    async def stop(self, container: str, timeout: float = 0) -> None:
        try:
            await self._cli("stop", "--time", str(int(timeout)), container)
        except RuntimeUnavailable as exc:
            if not _gone(exc):
                raise

    async def remove(self, containers: list[str]) -> None:
        if not containers:
            return
        extra = ["--ignore", "--time", "0"] if self.engine == "podman" else []
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                await self._cli("rm", "--force", *extra, *containers)
                return
            except RuntimeUnavailable as exc:
                if _gone(exc):
                    return
                if attempt == REMOVE_ATTEMPTS - 1:
                    raise
                # A container that is stopping on its own ("container state improper") cannot
                # be killed for a moment; once stopped it can be removed.
                await anyio.sleep(REMOVE_RETRY_DELAY)

    async def inspect(self, container: str) -> ContainerInfo | None:
        try:
            text = await self._cli("container", "inspect", container)
        except RuntimeUnavailable as exc:
            if _gone(exc):
                return None
            raise
        rows = json.loads(text or "[]")
        return _inspected(rows[0]) if rows else None

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        args = ["ps", "--all", "--no-trunc", "--format", "{{json .}}"]
        for key, value in (labels or {SESSION_LABEL: ""}).items():
            args += ["--filter", f"label={key}={value}" if value else f"label={key}"]
        return parse_ps_output(await self._cli(*args))

    async def info(self) -> RuntimeInfo:
        version = (await self._cli("--version")).strip()
        if self.engine != "podman":
            data = json.loads(await self._cli("info", "--format", "{{json .}}"))
            return RuntimeInfo(
                name=self.name,
                engine=self.engine,
                version=f"{version}; engine {data.get('ServerVersion', '?')}",
                endpoint=self.executable,
                rootless="rootless" in str(data.get("SecurityOptions", "")),
                cgroup_version=f"v{data.get('CgroupVersion', '?')}",
                oci_runtime=str(data.get("DefaultRuntime", "")),
            )
        host = json.loads(await self._cli("info", "--format", "json")).get("host", {})
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
        )

    # -- images ---------------------------------------------------------------------------------
    async def image_labels(self, image: str) -> dict[str, str] | None:
        try:
            text = await self._cli("image", "inspect", image)
        except RuntimeUnavailable as exc:
            if any(marker in str(exc).lower() for marker in (*_MISSING_IMAGE, "no such object")):
                return None
            raise
        try:
            (info,) = json.loads(text)
        except ValueError:
            return None
        # podman puts the labels at top level and under Config; docker only under Config.
        labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
        return {str(key): str(value) for key, value in labels.items()}

    async def import_image(self, tarball: Path, tag: str, changes: list[str]) -> None:
        argv = ["import", *(f"--change={change}" for change in changes), str(tarball), tag]
        try:
            await self._cli(*argv, timeout=IMPORT_TIMEOUT)
        except RuntimeUnavailable as exc:
            raise ImageError(f"{exc}; check free disk space and `{self.engine} info`") from None

    async def tag_image(self, image: str, tag: str) -> None:
        try:
            await self._cli("tag", image, tag)
        except RuntimeUnavailable as exc:
            raise ImageError(str(exc)) from None

    async def list_images(self, repository: str) -> list[str]:
        text = await self._cli("images", "--format", "{{.Repository}}:{{.Tag}}", repository)
        return [ref for ref in text.split() if not ref.endswith(":<none>")]

    async def remove_image(self, image: str) -> bool:
        try:
            await self._cli("rmi", image)
        except RuntimeUnavailable:
            return False
        return True

    # -- the CLI --------------------------------------------------------------------------------
    def _cwd(self) -> str | None:
        if self.workdir is None:
            return None
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return str(self.workdir)

    async def _cli(self, *args: str, timeout: float = CLI_TIMEOUT) -> str:
        try:
            with anyio.fail_after(timeout):
                result = await anyio.run_process([self.executable, *args], check=False, cwd=self._cwd())
        except TimeoutError:
            raise RuntimeUnavailable(
                f"`{self.engine} {args[0]}` did not answer within {timeout:g} s"
            ) from None
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot run {self.executable}: {exc.strerror}") from None
        if result.returncode != 0:
            err = result.stderr.decode(errors="replace").strip().splitlines()
            reason = err[-1] if err else f"exit status {result.returncode}"
            raise RuntimeUnavailable(f"`{self.engine} {args[0]}` failed: {reason[:500]}")
        return result.stdout.decode(errors="replace")


def _gone(exc: Exception) -> bool:
    text = str(exc).lower()
    return "no such container" in text or "no container with name or id" in text


_STATES = {state.value: state for state in ContainerState}


def _state(raw: Any) -> ContainerState:
    text = str(raw or "").lower()
    if text in ("stopped", "dead", "configured"):  # podman's spellings
        return ContainerState.EXITED if text != "configured" else ContainerState.CREATED
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
