"""TEST DOUBLE: a "runtime" that runs the sandbox agent as a plain local subprocess.

No container, no isolation, no limits: the tunnel, the sessions and the server are tested fast and
without podman through exactly the code paths the real backends use (create, attach a stdio
stream, inspect, remove). It is never selected by a user setting; tests and benches construct it
directly. Each "container" is a temporary directory (``workspace/`` is its /workspace), removed
with it; the agent runs on the tests' interpreter, and any image name runs it. A durable spec works
as with the engine API, but nothing separates kernel code from the handover: see
docs/design/packages-and-images.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.image.containerfile import AGENT_PREFIX
from kernelbridge.inside.agent.adoption import RELAY_UID_ENV
from kernelbridge.inside.handover import AGENT_PID_ENV, SOCKET_ENV
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
from kernelbridge.runtime.cli.stream import ProcessStream, StderrDrains
from kernelbridge.runtime.process import end_process
from kernelbridge.testing.images import MemoryImages

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_CODE = f"/{AGENT_PREFIX}/"
"""Where the image keeps the code that runs inside: here, the checkout."""


def local_path(arg: str) -> str:
    """An exec's argument with the image's paths made this machine's: its Python is the one running
    the tests, its copy of kernelbridge the checkout."""
    if arg in ("python3", "/usr/bin/python3"):
        return sys.executable
    if arg.startswith(IMAGE_CODE):
        return str(REPO_ROOT / arg[len(IMAGE_CODE) :])
    return arg


@dataclass
class _Local:
    spec: ContainerSpec
    root: Path
    process: anyio.abc.Process | None = None
    removed: bool = False
    execs: list[anyio.abc.Process] = field(default_factory=list)

    @property
    def attach_point(self) -> str:
        return f"kernelbridge-test-{self.root.name}"


class _DetachableStream(ProcessStream):
    """A durable local "container"'s stdio: closing it closes the agent's stdin and stops reading
    its stdout, and the agent runs on (as a container's does when its attachment goes)."""

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    with contextlib.suppress(Exception):
                        await pipe.aclose()


@dataclass
class LocalProcessRuntime(RuntimeBackend):
    """Runs ``python -m kernelbridge.inside.agent`` locally per "container". Tests only."""

    name: str = "local-test-double"
    engine: str = "local"
    images: ImageStore = field(init=False, repr=False)
    _containers: dict[str, _Local] = field(default_factory=dict, init=False)
    _drains: StderrDrains = field(default_factory=StderrDrains, init=False, repr=False)

    def __post_init__(self) -> None:
        self.images = MemoryImages(in_use=self._images_in_use)

    def _images_in_use(self) -> set[str]:
        return {local.spec.image for local in self._containers.values() if not local.removed}

    async def __aenter__(self) -> LocalProcessRuntime:
        await self._drains.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.remove(list(self._containers))
        await self._drains.aclose()

    async def create(self, spec: ContainerSpec) -> str:
        cid = f"local-{os.urandom(6).hex()}"
        root = Path(tempfile.mkdtemp(prefix=f"kernelbridge-{cid}-"))
        (root / "workspace").mkdir()
        self._containers[cid] = _Local(spec, root)
        return cid

    async def attach(self, container: str) -> ContainerStream:
        local = self._containers.get(container)
        if local is None or local.removed or not self._drains.is_open:
            raise RuntimeUnavailable(f"no such container {container}")
        if local.process is not None:
            raise RuntimeUnavailable(f"{container} was attached already (stdin is open once)")
        root = local.root
        (root / "runtime").mkdir(mode=0o700, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "PYTHONPATH": str(REPO_ROOT),
            "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
            "IPYTHONDIR": str(root / "ipython"),
            "MPLCONFIGDIR": str(root / "matplotlib"),
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "KERNELBRIDGE_WORKDIR": str(root / "workspace"),
            SOCKET_ENV: local.attach_point,
            RELAY_UID_ENV: str(os.getuid()),
            **dict(local.spec.env),
        }
        command = list(local.spec.command) or [sys.executable, "-m", "kernelbridge.inside.agent"]
        process = await anyio.open_process(
            command,
            stdin=-1,
            stdout=-1,
            stderr=-1,
            env=env,
            cwd=str(root / "workspace"),
            start_new_session=True,
        )
        local.process = process
        stream = _DetachableStream(process) if local.spec.durable else ProcessStream(process)
        self._drains.drain(stream)
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
        local = self._containers.get(container)
        if local is None or local.removed or local.process is None or local.process.returncode is not None:
            raise RuntimeUnavailable(f"cannot attach to {container} again: it is not running")
        environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **dict(env),
            SOCKET_ENV: local.attach_point,
            AGENT_PID_ENV: str(local.process.pid),
        }
        process = await anyio.open_process(
            [local_path(arg) for arg in command],
            stdin=-1,
            stdout=-1,
            stderr=-1,
            env=environ,
            cwd=workdir,
            start_new_session=True,
        )
        local.execs.append(process)
        stream = ProcessStream(process)
        self._drains.drain(stream)
        return stream

    async def remove(self, containers: list[str]) -> None:
        for cid in containers:
            local = self._containers.pop(cid, None)
            if local is None:
                continue
            local.removed = True
            for exec_process in local.execs:
                await end_process(exec_process, ask=None, grace=0)
            if local.process is not None:
                # The agent and its kernel (its own process group) are one "container".
                await end_process(local.process, ask=None, grace=0, group=True)
            shutil.rmtree(local.root, ignore_errors=True)

    async def inspect(self, container: str) -> ContainerInfo | None:
        local = self._containers.get(container)
        return None if local is None else self._info(container, local)

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        wanted = labels or {SESSION_LABEL: ""}
        found = []
        for cid, local in self._containers.items():
            have = local.spec.all_labels()
            if all(k in have and (not v or have[k] == v) for k, v in wanted.items()):
                found.append(self._info(cid, local))
        return found

    def _info(self, cid: str, local: _Local) -> ContainerInfo:
        process = local.process
        if process is None:
            state, code = ContainerState.CREATED, None
        elif process.returncode is None:
            state, code = ContainerState.RUNNING, None
        else:
            state, code = ContainerState.EXITED, process.returncode
        return ContainerInfo(cid, local.spec.name, local.spec.all_labels(), state, code)

    async def info(self) -> RuntimeInfo:
        version = sys.version.split()[0]
        return RuntimeInfo(self.name, self.engine, version, "local", limits_enforced=False, reattach=True)
