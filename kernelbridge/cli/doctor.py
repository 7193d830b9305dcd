"""``kernelbridge doctor``: can this machine run sandboxes, and are their limits real?

One line per check (``ok``, ``warn`` or ``FAIL``; ``settings``: one line per bad setting), then a
``summary`` line naming the degraded (``warn``) and failed checks; the exit status is non-zero if any
check failed. Every check that can run runs: only one that needs what an earlier one could not
provide (a runtime that answers, the image) is skipped, saying why. Everything asked of the container
engine goes through the selected runtime, so a remote engine is checked like a local one.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio

from kernelbridge.config import SandboxLimits, Settings
from kernelbridge.errors import ADD_SERVERS, NO_HOST_SERVERS, KernelBridgeError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands
    from kernelbridge.runtime import ContainerSpec, RuntimeBackend

PROBE_MEMORY_MIB = 96
PROBE_MEMORY = f"{PROBE_MEMORY_MIB}m"
PROBE_PIDS = 48
# Reads the limits the container actually got, for cgroup v2 and v1 layouts.
LIMITS_PROBE = """
import json, pathlib
def read(*paths):
    for p in paths:
        try:
            return pathlib.Path(p).read_text().strip()
        except OSError:
            pass
print(json.dumps({
    "memory": read("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "pids": read("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
}))
"""


def add_parsers(sub: Subcommands) -> None:
    doctor = sub.add_parser("doctor", help="check the runtime, limits, image and a kernel start")
    doctor.set_defaults(run=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    return anyio.run(run_doctor, settings)


@dataclass
class Check:
    name: str
    status: str  # "ok" | "warn" | "FAIL" | "skip"
    detail: str

    def line(self) -> str:
        return f"{self.status:<5} {self.name:<10} {self.detail}"


class Doctor:
    def __init__(
        self, settings: Settings, out: Callable[[str], None] = print, env: Mapping[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.out = out
        self.env = env
        """Supplies HOME for the host MCP config (default: os.environ)."""
        self.checks: list[Check] = []
        self.runtime: RuntimeBackend | None = None
        self.reason = ""
        self.image: str | None = None
        self.answered = False
        """The runtime answered its info request (what the later checks need), whatever its limits."""

    def report(self, name: str, status: str, detail: str) -> bool:
        check = Check(name, status, detail)
        self.checks.append(check)
        self.out(check.line())
        return status in ("ok", "warn")

    def skip(self, names: list[str], why: str) -> None:
        for name in names:
            self.report(name, "skip", why)

    async def check(self, name: str, probe: Callable[[], Awaitable[tuple[str, str]]]) -> bool:
        try:
            status, detail = await probe()
        except KernelBridgeError as exc:
            status, detail = "FAIL", str(exc)
        except Exception as exc:  # a doctor reports every failure as a line, never a traceback
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
        return self.report(name, status, detail)

    async def runtime_check(self) -> tuple[str, str]:
        from kernelbridge.runtime import VFS_WARNING, cgroup_layout

        assert self.runtime is not None
        info = await self.runtime.info()
        self.answered = True
        forced = getattr(self.runtime, "oci_runtime", None)
        why = " (forced: crun fails on hybrid cgroups)" if forced else ""
        detail = (
            f"{self.reason}; {info.version}; OCI runtime {info.oci_runtime or '?'}{why}"
            f"; cgroups {info.cgroup_version} ({cgroup_layout()})"
            f"; {'rootless' if info.rootless else 'rootful'}"
        )
        if not info.limits_enforced:
            ignored = ": the runtime IGNORES --memory and --pids-limit (rootless on cgroup v1)"
            if self.settings.allow_unlimited:
                return "warn", detail + ignored + "; allowed by KERNELBRIDGE_ALLOW_UNLIMITED"
            return "FAIL", (
                detail + ignored + "; `serve` refuses to start sandboxes until KERNELBRIDGE_ALLOW_UNLIMITED=1"
                " (or run podman as root, or on cgroup v2 with the memory and pids controllers delegated)"
            )
        if info.engine == "podman" and info.rootless and info.storage_driver == "vfs":
            return "warn", detail + f"; {VFS_WARNING}"
        return "ok", detail

    async def durable_check(self) -> tuple[str, str]:
        """Whether sessions outlive their bridge here (KERNELBRIDGE_DURABLE and the runtime)."""
        assert self.runtime is not None
        if not self.settings.durable:
            return "ok", "sessions end with their bridge (KERNELBRIDGE_DURABLE=0)"
        if not (await self.runtime.info()).reattach:
            return "warn", (
                f"the {self.runtime.name} backend cannot reach a running sandbox again, so sessions end "
                "with their bridge here; the engine API backends keep them (KERNELBRIDGE_RUNTIME=podman-api)"
            )
        return "ok", (
            "sessions outlive their bridge: the next bridge on this state directory adopts them "
            f"(idle timeout {self.settings.idle_timeout:g} s; KERNELBRIDGE_DURABLE=0 turns it off)"
        )

    async def image_check(self) -> tuple[str, str]:
        from kernelbridge.host.policy import expected_image, verify_image
        from kernelbridge.image import (
            PACKAGES_LABEL,
            contents_from_settings,
            image_hash,
            labels_status,
            parse_packages,
        )

        assert self.runtime is not None
        image, expected = expected_image(self.settings)
        labels = await verify_image(self.runtime, image, expected, explicit=bool(self.settings.image))
        if not self.settings.image:
            if labels_status(labels, image_hash(contents_from_settings(self.settings))) != "current":
                return "FAIL", f"{image} is stale: run `kernelbridge image build`"
        self.image = image
        packages = parse_packages(labels.get(PACKAGES_LABEL))
        return "ok", f"{image} is current" + (f" ({', '.join(packages)})" if packages else "")

    async def state_check(self) -> tuple[str, str]:
        from kernelbridge.config import check_state_dir

        check_state_dir(self.settings)
        return "ok", f"{self.settings.state_dir} is writable"

    async def limits_check(self) -> tuple[str, str]:
        from kernelbridge.runtime import ContainerSpec
        from kernelbridge.runtime.reaper import own_start

        assert self.runtime is not None and self.image is not None
        spec = ContainerSpec(
            image=self.image,
            name=f"kernelbridge-doctor-{os.getpid()}",
            session="doctor",
            owner_pid=os.getpid(),
            owner_start=own_start(),
            limits=SandboxLimits(memory=PROBE_MEMORY, pids=PROBE_PIDS),
            command=("python3", "-c", LIMITS_PROBE),
        )
        output = await probe_output(self.runtime, spec)
        seen = json.loads(output)
        memory_ok = seen["memory"] == str(PROBE_MEMORY_MIB * 1024 * 1024)
        pids_ok = seen["pids"] == str(PROBE_PIDS)
        detail = f"memory {seen['memory']}, pids {seen['pids']} seen inside a probe container"
        if memory_ok and pids_ok:
            return "ok", f"memory and pids limits enforced ({detail})"
        status = "warn" if self.settings.allow_unlimited else "FAIL"
        return status, f"limits NOT enforced ({detail}; asked for {PROBE_MEMORY} and {PROBE_PIDS})"

    async def kernel_check(self) -> tuple[str, str]:
        from kernelbridge.host import Sandbox, SandboxHandlers, expected_image
        from kernelbridge.session.recorder import Recorder

        assert self.runtime is not None
        image, agent_hash = expected_image(self.settings)
        started = time.perf_counter()
        sandbox = Sandbox.create(self.settings, self.runtime, "doctor", image=image, agent_hash=agent_hash)
        recorder = Recorder(output_limit=1000)
        cell = recorder.expect(uuid.uuid4().hex, "1+1")
        async with anyio.create_task_group() as tg:
            await tg.start(partial(sandbox.run, SandboxHandlers(recorder.on_iopub, recorder.on_reply)))
            try:
                await sandbox.kernel.execute("1+1", msg_id=cell.msg_id, wait=False)
                deadline = time.monotonic() + 30
                while not cell.done and time.monotonic() < deadline and sandbox.alive:
                    await cell.changed(deadline)
            finally:
                await sandbox.close()
        elapsed = time.perf_counter() - started
        if cell.outputs.result != "2":
            return "FAIL", f"the kernel answered {cell.outputs.result!r} to 1+1"
        versions = sandbox.versions
        return "ok", (
            f"a sandboxed kernel started and ran 1+1 in {elapsed:.2f} s "
            f"(python {versions.get('python')}, ipykernel {versions.get('ipykernel')})"
        )

    async def hub_check(self) -> tuple[str, str]:
        """Host MCP config: the servers found (after the operator's policy) and the problems.
        Reads the files only; starts no server."""
        from kernelbridge.hub import Policy, load_catalog

        catalog = load_catalog(self.settings, self.env)
        policy = Policy.from_settings(self.settings)
        names = [name for name in catalog.servers if policy.server_allowed(name)]
        denied = len(catalog.servers) - len(names)
        if names:
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            origins: dict[str, int] = {}
            for name in names:
                origin = catalog.servers[name].origin or "?"
                origins[origin] = origins.get(origin, 0) + 1
            where = ", ".join(f"{origin} {count}" for origin, count in origins.items())
            detail = (
                f"{len(names)} host MCP server{'s' * (len(names) != 1)} configured: {shown} (from {where})"
            )
        else:
            detail = f"{NO_HOST_SERVERS} configured ({ADD_SERVERS})"
        if denied:
            detail += f"; {denied} denied by the operator's settings"
        if catalog.problems:
            more = f" (and {len(catalog.problems) - 1} more)" if len(catalog.problems) > 1 else ""
            return "warn", f"{detail}; skipped: {catalog.problems[0]}{more}"
        return "ok", detail

    def settings_check(self) -> None:
        """One line per setting that cannot be read (``Settings.problems``): the checks after it
        use that setting's default, and ``serve`` starts no sandbox until it is fixed."""
        for problem in self.settings.problems:
            self.report("settings", "FAIL", f"{problem} (`serve` refuses every sandbox until it is fixed)")
        if not self.settings.problems:
            self.report("settings", "ok", "every KERNELBRIDGE_* setting reads")

    async def run(self) -> int:
        from kernelbridge.runtime import open_selection
        from kernelbridge.runtime.info_store import forget

        self.settings_check()
        await self.check("state", self.state_check)
        # People run doctor after changing their setup: its engine must be asked afresh. Dropping
        # the kept infos here, rather than a "fresh" flag through the selection, reaches every
        # backend it may open (a socket, its own service, the CLI) in one line, and its first ask
        # keeps the new answer for the bridges after it.
        forget()
        try:
            async with open_selection(self.settings) as selection:
                self.runtime, self.reason = selection.backend, selection.reason
                await self.run_checks()
        except KernelBridgeError as exc:  # no runtime at all: still one line per check
            self.report("runtime", "FAIL", str(exc))
            self.skip(["image", "limits", "kernel"], "needs a container runtime that answers")
            await self.check("hub", self.hub_check)
        self.out(self.summary())
        failed = [c.name for c in self.checks if c.status == "FAIL"]
        return 1 if failed else 0

    async def run_checks(self) -> None:
        await self.check("runtime", self.runtime_check)
        if not self.answered:
            self.skip(["durable", "image", "limits", "kernel"], "needs a container runtime that answers")
        elif not await self.check("durable", self.durable_check) or not await self.check(
            "image", self.image_check
        ):
            self.skip(["limits", "kernel"], "needs the sandbox image")
        else:
            await self.check("limits", self.limits_check)
            await self.check("kernel", self.kernel_check)
        await self.check("hub", self.hub_check)

    def summary(self) -> str:
        """The last line: which results are degraded or failed (each line above says why)."""
        by_status: dict[str, list[str]] = {}
        for check in self.checks:
            by_status.setdefault(check.status, []).append(check.name)
        parts = [f"ok: {', '.join(by_status['ok'])}"] if by_status.get("ok") else []
        if by_status.get("warn"):
            parts.append(f"degraded: {', '.join(by_status['warn'])}")
        if by_status.get("FAIL"):
            parts.append(f"FAILED: {', '.join(by_status['FAIL'])}")
        if by_status.get("skip"):
            parts.append(f"not checked: {', '.join(by_status['skip'])}")
        status = "FAIL" if by_status.get("FAIL") else "warn" if by_status.get("warn") else "ok"
        return Check("summary", status, "; ".join(parts)).line()


PROBE_TIMEOUT = 60.0
PROBE_OUTPUT_BYTES = 1 << 16


async def probe_output(runtime: RuntimeBackend, spec: ContainerSpec) -> str:
    """Run a short command in a container of ``spec`` and return its stdout (bounded in time and
    size); the container is removed afterwards. Raises SandboxError if it fails."""
    from kernelbridge.errors import SandboxError
    from kernelbridge.host.container import started_container

    chunks: list[bytes] = []
    with anyio.fail_after(PROBE_TIMEOUT):
        async with started_container(runtime, spec) as container:
            stream = container.stream
            await stream.send_eof()
            try:
                while sum(map(len, chunks)) < PROBE_OUTPUT_BYTES:
                    chunks.append(await stream.receive())
            except anyio.EndOfStream:
                pass
            info = await runtime.inspect(container.id)
            tail = stream.stderr_tail()
    if info is not None and info.exit_code not in (0, None):
        raise SandboxError(f"the probe container failed (status {info.exit_code}): {' | '.join(tail[-2:])}")
    return b"".join(chunks).decode(errors="replace")


async def run_doctor(settings: Settings, out: Callable[[str], None] = print) -> int:
    """Run every check, printing one line each; returns the process exit status."""
    return await Doctor(settings, out).run()
