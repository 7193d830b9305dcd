"""A real bridge for the suites: ``kernelbridge serve`` over stdio (or ``--http``), as its own process.

The bridge runs exactly as an MCP host starts it, so that its memory (VmRSS, VmHWM) can be
measured apart from the test process, and so that it can be killed. Every wait is bounded;
helpers return plain data a test can assert on. ``tests/`` is on ``sys.path``: the conftests
(the suite-wide fixtures in tests/conftest.py, the integration suite's, the module-scoped bridge
of the security and fault suites) and test modules import from here, and so does
``peers.host_bridge``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.dispatcher import ProgressFnT

REPO = Path(__file__).resolve().parents[1]
KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
CLIENT_TIMEOUT = 180.0
"""Bound on one MCP request (a cold sandbox start on a loaded 2-core machine takes seconds)."""
VERDICT = "@@verdict@@"
"""Marks the line of JSON a probe prints as its last act (see :meth:`Bridge.probe`)."""


PASSED_ON = (
    "KERNELBRIDGE_ALLOW_UNLIMITED",
    "KERNELBRIDGE_IMAGE_PACKAGES",
    "KERNELBRIDGE_IMAGE_PROFILE",
    "PYTHONPATH",
)
"""Variables of the test process that the spawned bridges get too: the suite run as an
unprivileged user on cgroup v1 (tests/install) allows unlimited sandboxes, with an image of extra
packages and the checkout's code; the MCP client passes only a few variables on by itself."""

STATE_DIRS: set[Path] = set()
"""Every state directory a bridge of this test process was started on (:func:`uses_state_dir`)
and not swept yet. Sessions outlive their bridge by default, so a test's sandboxes run on,
detached, after its bridges exit, as they would for a user; :func:`end_detached_sandboxes` removes
them once no bridge of the run uses their state directory any more (tests/conftest.py, after
each test and module)."""
EVERY_STATE_DIR: set[Path] = set()
""":data:`STATE_DIRS` and those already swept: the run's last sweep looks at every one again (a
sandbox whose create was in flight when its bridge exited appears a moment later)."""


def uses_state_dir(state_dir: Path) -> Path:
    """Remember that a bridge is started on ``state_dir`` (its detached sandboxes are removed
    after the test); returns it."""
    STATE_DIRS.add(Path(os.path.realpath(state_dir)))
    EVERY_STATE_DIR.add(Path(os.path.realpath(state_dir)))
    return state_dir


RUN_LABEL_KEY = "kernelbridge.test-run"


def run_label() -> str:
    """``kernelbridge.test-run=<id>``, this run's label, out of ``KERNELBRIDGE_LABELS`` (which a
    test may extend with labels of its own: the sweep must not depend on them)."""
    labels = (item.strip() for item in os.environ["KERNELBRIDGE_LABELS"].split(","))
    (label,) = (item for item in labels if item.startswith(f"{RUN_LABEL_KEY}="))
    return label


def sandboxes_of_state_dirs(state_dirs: set[Path]) -> list[str]:
    """Ids of this run's durable sandboxes of ``state_dirs`` and of their HTTP namespaces,
    running or not (one engine listing)."""
    from kernelbridge.host.container import STATE_LABEL, state_identity

    identities = set()
    for state_dir in state_dirs:
        for namespace in [state_dir, *sorted((state_dir / "http").glob("*"))]:
            identities.add(state_identity(namespace))
    listing = podman("ps", "-a", "--filter", f"label={run_label()}", "--format", "{{.ID}} {{.Labels}}")
    found = []
    for line in listing.splitlines():
        container, _, labels = line.partition(" ")
        if any(f"{STATE_LABEL}:{identity}" in labels for identity in identities):
            found.append(container)
    return found


def end_detached_sandboxes(*, every: bool = False) -> list[Path]:
    """Remove the sandboxes of every remembered state directory that no bridge uses any more (a
    module's bridge still running keeps its own); ``every``: those swept before too. Returns the
    state directories swept."""
    serving = serving_state_dirs()
    unused = {d for d in (EVERY_STATE_DIR if every else STATE_DIRS) if d not in serving}
    if unused and (left := sandboxes_of_state_dirs(unused)):
        podman("rm", "-f", "-t", "0", *left, timeout=120)
    STATE_DIRS.difference_update(unused)
    return sorted(unused)


def ensure_image() -> str:
    """The current sandbox image of the configured profile and extra packages
    (``KERNELBRIDGE_IMAGE_PROFILE``, ``KERNELBRIDGE_IMAGE_PACKAGES``; the full profile and none by
    default: the bridges the tests start expect that image), built once if missing or
    stale (about two minutes); skips without podman."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    from kernelbridge.config import load_settings
    from kernelbridge.image import contents_from_settings
    from kernelbridge.testing import ensure_sandbox_image

    return ensure_sandbox_image(contents=contents_from_settings(load_settings()))


def serve_params(state_dir: Path, *args: str, **env: str) -> StdioServerParameters:
    """``kernelbridge serve ARGS`` with its state in ``state_dir``: this test run's label, PATH and
    :data:`PASSED_ON` from the test process, then ``env``."""
    uses_state_dir(state_dir)
    base = {
        "KERNELBRIDGE_STATE_DIR": str(state_dir),
        "KERNELBRIDGE_LABELS": os.environ["KERNELBRIDGE_LABELS"],
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **{key: value for key, value in os.environ.items() if key in PASSED_ON},
    }
    return StdioServerParameters(
        command=str(KERNELBRIDGE), args=["serve", *args], env={**base, **env}, cwd=str(REPO)
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range: a port from that
    range can be taken, before the server binds it, as the source port of any outgoing connection
    (another worker's, or the readiness probe's own self-connect)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def serve_pids(state_dir: Path) -> list[int]:
    """PIDs of ``kernelbridge serve`` processes using ``state_dir`` (found via /proc environ: its
    KERNELBRIDGE_STATE_DIR, or the HOME whose default state directory it is)."""
    return serving_state_dirs().get(Path(os.path.realpath(state_dir)), [])


def serving_state_dirs() -> dict[Path, list[int]]:
    """Every running ``kernelbridge serve`` process's state directory, with their PIDs: one pass
    over /proc, however many state directories are asked about."""
    found: dict[Path, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"serve" not in (entry / "cmdline").read_bytes().split(b"\0"):
                continue
            state_dir = _state_dir_of((entry / "environ").read_bytes())
        except OSError:
            continue
        if state_dir is not None:
            found.setdefault(state_dir, []).append(int(entry.name))
    return found


def _state_dir_of(environ: bytes) -> Path | None:
    variables = dict(item.partition(b"=")[::2] for item in environ.split(b"\0") if item)
    if explicit := variables.get(b"KERNELBRIDGE_STATE_DIR"):
        return Path(os.path.realpath(os.fsdecode(explicit)))
    if (home := variables.get(b"HOME")) and b"XDG_STATE_HOME" not in variables:
        return Path(os.path.realpath(os.fsdecode(home))) / ".local" / "state" / "kernelbridge"
    return None


def status_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


def rss_kib(pid: int) -> int:
    """The resident set size of ``pid`` now."""
    return status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """The peak resident set size of ``pid`` (VmHWM): catches a spike between two samples."""
    return status_kib(pid, "VmHWM")


def children(pid: int, *, zombies: bool = True) -> list[int]:
    """Direct children of ``pid`` (from /proc; without the exited ones unless ``zombies``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid and (zombies or state != "Z"):
            found.append(int(stat.parent.name))
    return found


def podman(*args: str, timeout: float = 60, check: bool = False) -> str:
    """``podman ARGS``' output; ``check``: a failure raises, with podman's own words (for a fault a
    test injects: a pause that did not happen is no paused container)."""
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def list_containers() -> list[str]:
    """Names of kernelbridge sandbox containers (running or not)."""
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", "label=kernelbridge.session", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return out.split()


async def container_gone(container: str, timeout: float = 60.0) -> bool:
    """Wait (bounded) until ``container`` no longer exists; False if it still does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if container not in podman("ps", "-a", "--format", "{{.Names}}").split():
            return True
        await anyio.sleep(0.5)
    return False


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    with contextlib.suppress(OSError), open(path, "wb") as filler:
        while True:
            filler.write(b"\0" * 65536)


@dataclass
class Result:
    """One ``run_python`` answer, flattened for assertions."""

    is_error: bool
    text: str
    data: dict[str, Any]
    seconds: float

    @property
    def status(self) -> str | None:
        return self.data.get("status")

    @property
    def stdout(self) -> str:
        return str(self.data.get("stdout") or "")

    @property
    def notes(self) -> str:
        """The notes' sentences, joined (for messages: assert on :attr:`codes`)."""
        return " ".join(self.data.get("notes") or [])

    @property
    def codes(self) -> list[str]:
        """The notes' machine-readable codes (``structuredContent.note_codes``)."""
        return list(self.data.get("note_codes") or [])

    def verdict(self) -> Any:
        """The JSON a probe printed after :data:`VERDICT`."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith(VERDICT):
                return json.loads(line[len(VERDICT) :])
        raise AssertionError(f"no verdict in the output: {self.text[-2000:]}")


@dataclass
class Bridge:
    client: Client
    state_dir: Path
    pid: int
    sessions: set[str] = field(default_factory=set)

    async def run(
        self,
        code: str,
        session: str,
        timeout: int = 30,
        *,
        on_progress: ProgressFnT | None = None,
        **extra: Any,
    ) -> Result:
        """``run_python``; ``on_progress`` gets the call's progress notifications (their message
        is the tail of the cell's output so far)."""
        self.sessions.add(session)
        start = time.monotonic()
        with anyio.fail_after(CLIENT_TIMEOUT):
            answer = await self.client.call_tool(
                "run_python",
                {"code": code, "session": session, "timeout": timeout, **extra},
                progress_callback=on_progress,
            )
        text = text_of(answer)
        return Result(bool(answer.is_error), text, answer.structured_content or {}, time.monotonic() - start)

    async def probe(self, code: str, session: str, timeout: int = 60, **extra: Any) -> Any:
        """Run ``code``, which must leave its findings in a variable ``verdict``; return them."""
        tail = f"\nimport json as _j\nprint({VERDICT!r} + _j.dumps(verdict))"
        result = await self.run(code + tail, session, timeout, **extra)
        assert result.status == "ok", result.text[-3000:]
        return result.verdict()

    async def call(self, tool: str, **args: Any) -> tuple[bool, str]:
        with anyio.fail_after(CLIENT_TIMEOUT):
            answer = await self.client.call_tool(tool, args)
        text = text_of(answer)
        return bool(answer.is_error), text

    async def notebook(self, session: str) -> str:
        """``session``'s notebook as the resource serves it (``export_notebook`` only says where)."""
        return await notebook_of(self.client, session)

    async def listed(self) -> dict[str, dict[str, Any]]:
        _, text = await self.call("list_sessions")
        return {s["session"]: s for s in json.loads(text)["sessions"]}

    async def container(self, session: str) -> str:
        return str((await self.listed())[session]["container"])

    async def close(self, session: str) -> None:
        await self.call("close_session", session=session)
        self.sessions.discard(session)

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def peak_kib(self) -> int:
        return peak_rss_kib(self.pid)

    def connection(self, session: str) -> dict[str, Any]:
        from kernelbridge.session.store import SessionStore

        record = SessionStore(self.state_dir).current(session)
        assert record is not None and record.connection_file is not None, f"no live record of {session}"
        return json.loads(Path(record.connection_file).read_text())

    def journal(self, session: str) -> Path:
        """The journal of ``session``'s current generation."""
        from kernelbridge.session.store import SessionStore

        return SessionStore(self.state_dir).journal(session)


def module_bridge(name: str) -> Any:
    """A module-scoped ``bridge`` fixture (a conftest binds it as ``bridge``): one real bridge per
    test module with its state in a temporary directory named ``name``, 16 sessions and a warm
    pool of one. Every attack runs in a session of its own, so an attack that ends its sandbox
    costs only that session; the sessions are closed when the module ends, and the suite-wide
    check in tests/conftest.py fails if any container is left behind."""

    @pytest.fixture(scope="module")
    async def bridge(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> AsyncIterator[Bridge]:
        state = tmp_path_factory.mktemp(name) / "state"
        async with open_bridge(state, KERNELBRIDGE_MAX_SESSIONS="16") as opened:
            yield opened

    return bridge


@asynccontextmanager
async def open_bridge(state_dir: Path, *, mode: str = "auto", **env: str) -> AsyncIterator[Bridge]:
    """A fresh ``kernelbridge serve`` over stdio with its state in ``state_dir`` (``mode``: the
    SDK client's, e.g. "legacy" for a 2025-11-25 client)."""
    await anyio.Path(state_dir).mkdir(parents=True, exist_ok=True)
    params = serve_params(state_dir, **env)
    async with Client(params, mode=mode, read_timeout_seconds=CLIENT_TIMEOUT) as client:  # type: ignore[arg-type]
        pids = serve_pids(state_dir)
        assert len(pids) == 1, pids
        yield Bridge(client, state_dir, pids[0])


@asynccontextmanager
async def open_http_bridge(
    state_dir: Path,
    tokens: dict[str, str],
    *,
    command: list[str] | None = None,
    mode: str = "auto",
    **env: str,
) -> AsyncIterator[dict[str, Bridge]]:
    """A fresh ``kernelbridge serve --http`` on a free loopback port with one bearer token per
    namespace (``{"alice": token, ...}``), and a real MCP client over streamable HTTP for each:
    ``{namespace: Bridge}``, each Bridge's ``state_dir`` its namespace's own. Stopped with SIGTERM
    afterwards (it must exit 0). ``command`` replaces the ``kernelbridge`` executable (a bench runs
    another tree's)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    port = free_port()
    await anyio.Path(state_dir).mkdir(parents=True, exist_ok=True)
    uses_state_dir(state_dir)
    environ = {
        **os.environ,
        "KERNELBRIDGE_STATE_DIR": str(state_dir),
        "KERNELBRIDGE_HTTP_TOKENS": ",".join(f"{name}:{token}" for name, token in tokens.items()),
        **env,
    }
    argv = [*(command or [str(KERNELBRIDGE)]), "serve", "--http", "--port", str(port)]
    async with await anyio.open_process(argv, env=environ, stdin=None, stdout=None, stderr=None) as proc:
        try:
            with anyio.fail_after(60):
                while True:
                    assert proc.returncode is None, "kernelbridge serve --http exited"
                    try:
                        await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                        break
                    except OSError:
                        await anyio.sleep(0.05)
            async with contextlib.AsyncExitStack() as stack:
                bridges = {}
                for name, token in tokens.items():
                    http = create_mcp_http_client(headers={"authorization": f"Bearer {token}"})
                    transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
                    client = await stack.enter_async_context(
                        Client(transport, mode=mode, read_timeout_seconds=CLIENT_TIMEOUT)  # type: ignore[arg-type]
                    )
                    bridges[name] = Bridge(client, state_dir / "http" / name, proc.pid)
                yield bridges
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                status = await proc.wait()
            assert status == 0, f"the bridge exited with {status}"


def stop_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (processes this test started). ``pid`` goes first, as
    in a crash: killed after its children, a bridge could see its engine's service die and answer
    the call in flight before its own turn came."""
    tree = descendants(pid)
    for each in (pid, *tree):
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, listed before any is killed (an orphan leaves the tree)."""
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


@asynccontextmanager
async def local_bridge(state_dir: Path, **env: str) -> AsyncIterator[Client]:
    """The MCP server in this process over the local test-double runtime (no container, no
    isolation: for the bridge's own logic only), with an in-memory MCP client."""
    from kernelbridge.config import load_settings
    from kernelbridge.server import build_server
    from kernelbridge.testing import LocalProcessRuntime

    settings = load_settings({"KERNELBRIDGE_STATE_DIR": str(state_dir), "KERNELBRIDGE_WARM_POOL": "0", **env})
    async with LocalProcessRuntime() as runtime:
        app = build_server(settings, runtime=runtime)
        async with Client(app, read_timeout_seconds=CLIENT_TIMEOUT) as client:
            yield client


async def notebook_of(client: Client, session: str) -> str:
    """The text of ``session``'s notebook resource (``kernelbridge://sessions/NAME/notebook``)."""
    with anyio.fail_after(CLIENT_TIMEOUT):
        answer = await client.read_resource(f"kernelbridge://sessions/{session}/notebook")
    return "".join(getattr(part, "text", "") for part in answer.contents)


def text_of(answer: Any) -> str:
    return "\n".join(b.text for b in answer.content if getattr(b, "type", None) == "text")


def reset_peak(pid: int) -> None:
    """Reset ``pid``'s VmHWM to its current RSS (``clear_refs`` 5, Linux >= 4.0, as root), so
    that the next peak is one attack's own."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
