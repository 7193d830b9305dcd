"""Shared argv building and CLI calls for OCI-style runtimes (podman and docker agree on most flags)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import anyio

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import (
    OWNER_LABEL,
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    RuntimeBackend,
)

# Why 30 s: `podman ps`/`rm` answer in well under a second here, but a busy machine starting 20
# sandboxes at once can stall the client for several seconds. Past this the runtime is wedged.
CLI_TIMEOUT = 30.0
WORKDIR = "/workspace"
REMOVE_ATTEMPTS = 3
REMOVE_RETRY_DELAY = 0.5


@dataclass
class OciCliRuntime(RuntimeBackend):
    """Base for podman and docker; subclasses add their own flags in :meth:`extra_flags`."""

    name: str
    executable: str

    def extra_flags(self) -> list[str]:
        return []

    def remove_flags(self) -> list[str]:
        """Flags of ``rm`` besides ``-f``: how to skip names that are already gone."""
        return []

    def run_argv(self, spec: ContainerSpec) -> list[str]:
        lim = spec.limits
        argv = [
            self.executable, "run", "--rm", "-i", "--init",
            # Never reach for a registry: the image is built locally, and a miss must fail fast.
            "--pull", "never",
            "--name", spec.name,
            "--label", f"{SESSION_LABEL}={spec.session}",
            "--label", f"{OWNER_LABEL}={spec.owner_pid}",
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
        ]  # fmt: skip
        if lim.read_only:
            argv.append("--read-only")
        argv += self.extra_flags()
        for key, value in spec.env:
            argv += ["--env", f"{key}={value}"]
        argv.append(spec.image)
        argv += list(spec.command)
        return argv

    async def _cli(self, *args: str) -> str:
        try:
            with anyio.fail_after(CLI_TIMEOUT):
                result = await anyio.run_process([self.executable, *args], check=False)
        except TimeoutError:
            raise RuntimeUnavailable(
                f"`{self.name} {args[0]}` did not answer within {CLI_TIMEOUT:g} s"
            ) from None
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot run {self.executable}: {exc.strerror}") from None
        if result.returncode != 0:
            err = result.stderr.decode(errors="replace").strip().splitlines()
            reason = err[-1] if err else f"exit status {result.returncode}"
            raise RuntimeUnavailable(f"`{self.name} {args[0]}` failed: {reason}")
        return result.stdout.decode(errors="replace")

    async def version(self) -> str:
        return (await self._cli("--version")).strip()

    async def info(self, template: str) -> str:
        """``info --format TEMPLATE``: unlike ``--version`` it needs a working engine/storage."""
        return (await self._cli("info", "--format", template)).strip()

    async def list_containers(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        args = ["ps", "-a", "--no-trunc", "--format", "{{json .}}"]
        for key, value in (labels or {SESSION_LABEL: ""}).items():
            args += ["--filter", f"label={key}={value}" if value else f"label={key}"]
        return parse_ps_output(await self._cli(*args))

    async def remove(self, names: list[str]) -> None:
        if not names:
            return
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                await self._cli("rm", "-f", *self.remove_flags(), *names)
                return
            except RuntimeUnavailable as exc:
                if "no such container" in str(exc).lower():
                    return
                if attempt == REMOVE_ATTEMPTS - 1:
                    raise
                # A container that is stopping on its own ("container state improper") cannot
                # be killed for a moment; once stopped it can be removed.
                await anyio.sleep(REMOVE_RETRY_DELAY)


def parse_ps_output(text: str) -> list[ContainerInfo]:
    """Output of ``ps --format '{{json .}}'``: podman prints one JSON array, docker one object
    per line, and they spell some fields differently."""
    text = text.strip()
    if not text:
        return []
    rows = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()]
    return [_container_info(row) for row in rows]


def _container_info(row: dict[str, object]) -> ContainerInfo:
    labels = row.get("Labels") or {}
    if isinstance(labels, str):  # docker: "k=v,k2=v2"
        labels = dict(item.partition("=")[::2] for item in labels.split(",") if item)
    assert isinstance(labels, dict)
    names = row.get("Names")
    name = names[0] if isinstance(names, list) and names else str(names or "")
    return ContainerInfo(
        id=str(row.get("Id") or row.get("ID") or ""),
        name=name,
        labels={str(k): str(v) for k, v in labels.items()},
        state=str(row.get("State") or row.get("Status") or ""),
    )
