"""``kernelbridge doctor``: can this machine run sandboxes, and are their limits real?

One line per check (``ok``, ``warn`` or ``FAIL``), and a non-zero exit status if any check
failed. Checks that depend on an earlier failed one are reported as skipped, not run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from kernelbridge.config import SandboxLimits, Settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.runtime import ContainerSpec, OciCliRuntime, cgroup_layout, detect_runtime

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


@dataclass
class Check:
    name: str
    status: str  # "ok" | "warn" | "FAIL" | "skip"
    detail: str

    def line(self) -> str:
        return f"{self.status:<5} {self.name:<10} {self.detail}"


class Doctor:
    def __init__(self, settings: Settings, out: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.out = out
        self.checks: list[Check] = []
        self.runtime: OciCliRuntime | None = None
        self.image: str | None = None

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
        self.runtime = detect_runtime(self.settings)
        version = await self.runtime.version()
        if self.runtime.name != "podman":
            # The client answers --version without an engine; `info` needs the engine itself.
            server = await self.runtime.info("{{.ServerVersion}}")
            return "ok", f"{version}; engine {server}"
        info = json.loads(await self.runtime.info("json"))
        host = info.get("host", {})
        rootless = bool(host.get("security", {}).get("rootless"))
        cgroups = host.get("cgroupVersion", "?")
        oci = host.get("ociRuntime", {}).get("name", "?")
        forced = getattr(self.runtime, "oci_runtime", None)
        why = " (forced: crun fails on hybrid cgroups)" if forced else ""
        detail = (
            f"{version}; OCI runtime {forced or oci}{why}"
            f"; cgroups {cgroups} ({cgroup_layout()}); {'rootless' if rootless else 'rootful'}"
        )
        if rootless and cgroups == "v1":
            return "FAIL", detail + ": rootless podman on cgroup v1 IGNORES --memory and --pids-limit"
        return "ok", detail

    async def image_check(self) -> tuple[str, str]:
        from kernelbridge.image import default_image, image_status

        assert self.runtime is not None
        self.image = self.settings.image or default_image()
        status = await anyio.to_thread.run_sync(image_status, self.runtime.executable, self.image)
        if status == "current":
            return "ok", f"{self.image} is current"
        self.image = None if status == "missing" else self.image
        return "FAIL", f"{self.image or 'the sandbox image'} is {status}: run `kernelbridge image build`"

    async def limits_check(self) -> tuple[str, str]:
        assert self.runtime is not None and self.image is not None
        spec = ContainerSpec(
            image=self.image,
            name=f"kernelbridge-doctor-{os.getpid()}",
            session="doctor",
            owner_pid=os.getpid(),
            limits=SandboxLimits(memory=PROBE_MEMORY, pids=PROBE_PIDS),
            command=("python3", "-c", LIMITS_PROBE),
        )
        with anyio.fail_after(60):
            result = await anyio.run_process(self.runtime.run_argv(spec), check=False)
        if result.returncode != 0:
            return "FAIL", f"probe container failed: {result.stderr.decode(errors='replace').strip()[-200:]}"
        seen = json.loads(result.stdout)
        memory_ok = seen["memory"] == str(PROBE_MEMORY_MIB * 1024 * 1024)
        pids_ok = seen["pids"] == str(PROBE_PIDS)
        detail = f"memory {seen['memory']}, pids {seen['pids']} seen inside a probe container"
        if memory_ok and pids_ok:
            return "ok", f"memory and pids limits enforced ({detail})"
        return "FAIL", f"limits NOT enforced ({detail}; asked for {PROBE_MEMORY} and {PROBE_PIDS})"

    async def kernel_check(self) -> tuple[str, str]:
        from kernelbridge.kernel import SandboxKernelManager, connect_client

        results: list[str] = []

        def collect(msg: dict) -> None:
            if msg["msg_type"] == "execute_result":
                results.append(msg["content"]["data"].get("text/plain", ""))

        started = time.perf_counter()
        km = SandboxKernelManager(settings=self.settings, session_name="doctor")
        await km.start_kernel()
        try:
            kc = await connect_client(km)
            try:
                reply = await kc.execute_interactive("1+1", timeout=30, output_hook=collect)
            finally:
                kc.stop_channels()
        finally:
            await km.shutdown_kernel(now=True)
        elapsed = time.perf_counter() - started
        if reply["content"]["status"] != "ok" or results != ["2"]:
            return "FAIL", f"the kernel answered {results!r} to 1+1"
        versions = km.versions or {}
        return "ok", (
            f"a sandboxed kernel started and computed 1+1=2 in {elapsed:.2f} s "
            f"(python {versions.get('python')}, ipykernel {versions.get('ipykernel')})"
        )

    async def run(self) -> int:
        if not await self.check("runtime", self.runtime_check):
            self.skip(["image", "limits", "kernel"], "needs a container runtime")
        elif not await self.check("image", self.image_check):
            self.skip(["limits", "kernel"], "needs the image")
        else:
            await self.check("limits", self.limits_check)
            await self.check("kernel", self.kernel_check)
        failed = [c.name for c in self.checks if c.status == "FAIL"]
        return 1 if failed else 0


async def run_doctor(settings: Settings, out: Callable[[str], None] = print) -> int:
    """Run every check, printing one line each; returns the process exit status."""
    return await Doctor(settings, out).run()
