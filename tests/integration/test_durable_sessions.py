"""Sessions that outlive their bridge (issue 15), with real bridges, real MCP clients over stdio and
real podman containers (the engine API backend, ``podman-api``, the local default).

Each test runs bridges one after another (or side by side) on one state directory, with every
setting at its default: a client exits (or its bridge is SIGKILLed), and the next bridge adopts
the session's sandbox on its first use. Every wait is on a condition with a bound; the sandboxes a
test leaves detached are removed when it ends (by the state directory's label), so the suite-wide
leftover check still holds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from bridge_harness import (
    CLIENT_TIMEOUT,
    KERNELBRIDGE,
    Bridge,
    children,
    open_bridge,
    open_http_bridge,
    podman,
    serve_params,
    serve_pids,
    stop_process_tree,
)
from durable_harness import (
    DURABLE,
    WAIT,
    forge_secret,
    pool_filled,
    running,
    secret_file,
    wait_for,
    workspace_files,
)
from mcp.client.client import Client

from kernelbridge.host.container import STATE_LABEL, state_identity
from kernelbridge.session.store import SessionStore

pytestmark = pytest.mark.anyio


def sandboxes_of(state_dir: Path, *, every: bool = True, warm: bool = False) -> list[str]:
    """Containers labelled with ``state_dir``'s identity (running ones only unless ``every``): the
    sessions' (those waiting in a warm pool, by its records, only with ``warm``)."""
    args = ["ps", "-q", "--no-trunc", "--filter", f"label={STATE_LABEL}={state_identity(state_dir)}"]
    found = podman(*([*args, "-a"] if every else args)).split()
    pooled = {record.container_id for record in SessionStore(state_dir).warm_records()}
    return [container for container in found if warm or container not in pooled]


@pytest.fixture
def state(tmp_path: Path, sandbox_image: str) -> Iterator[Path]:
    """The state directory the test's bridges share; its sandboxes are removed afterwards."""
    state_dir = tmp_path / "state"
    yield state_dir
    # Every namespace's (an HTTP token's state is state/http/<name>), and a sandbox whose create
    # was in flight at the engine when its bridge exited, which appears a moment later.
    namespaces = [state_dir, *sorted((state_dir / "http").glob("*"))]
    for attempt in range(2):
        left = [name for namespace in namespaces for name in sandboxes_of(namespace, warm=True)]
        if left:
            podman("rm", "-f", "-t", "0", *left, timeout=120)
        if attempt == 0:
            time.sleep(1.0)


def record(state_dir: Path, session: str) -> object:
    return SessionStore(state_dir).current(session)


def cli_env(state_dir: Path) -> dict[str, str]:
    return {**os.environ, "KERNELBRIDGE_STATE_DIR": str(state_dir)}


async def test_a_client_exit_and_restart_keeps_variables_files_and_imports(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        made = await bridge.run(
            "import fractions\nx = fractions.Fraction(3, 7)\nopen('/workspace/kept.txt', 'w').write('file')\n"
            "print('made')",
            "s",
        )
        assert made.status == "ok", made.text
        container = await bridge.container("s")
    # The client exited: its bridge let go of the sandbox, which runs on.
    await wait_for(lambda: running(container), "the sandbox runs on")
    stored = SessionStore(state).current("s")
    assert stored is not None and stored.detached is not None and stored.durable
    listing = await anyio.run_process([KERNELBRIDGE, "sessions", "--json"], env=cli_env(state))
    shown = json.loads(listing.stdout)
    assert [(s["name"], s["state"], s["container"]) for s in shown] == [("s", "detached", container)], shown

    async with open_bridge(state, **DURABLE) as bridge:
        # Adopted before the bridge answered initialize: its first call finds it attached.
        listed = await bridge.listed()
        assert [(name, s["state"]) for name, s in listed.items()] == [("s", "idle")], listed
        again = await bridge.run("print(x, open('/workspace/kept.txt').read(), fractions.__name__)", "s")
        assert again.status == "ok" and again.stdout == "3/7 file fractions\n", again.text
        assert again.data["state"] == "kept" and "adopted" in again.codes, again.text
        assert "its bridge exited" in again.notes, again.notes
        assert await bridge.container("s") == container
        second = await bridge.run("print(x * 2)", "s")
        assert second.stdout == "6/7\n" and "adopted" not in second.codes
        # The journal goes on where it stopped: one generation, every cell.
        journal = [json.loads(line) for line in bridge.journal("s").read_text().splitlines() if line]
        codes = [entry.get("code", "") for entry in journal if entry.get("type") == "cell"]
        assert len(codes) == 3 and "fractions.Fraction" in codes[0] and codes[2] == "print(x * 2)", codes
        await bridge.close("s")
    await wait_for(lambda: not sandboxes_of(state), "close_session removed the sandbox")


async def test_sigkill_mid_cell_then_a_new_bridge_hears_how_the_cell_ended(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("import time\ny = 41", "s")).status == "ok"
        container = await bridge.container("s")

        async def long_cell() -> None:
            with pytest.raises(Exception):  # noqa: B017 - the bridge is killed under it
                await bridge.run(
                    "open('/workspace/started', 'w').close()\ntime.sleep(8)\ny += 1\nprint('late', y)", "s"
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_cell)
            await wait_for(
                lambda: workspace_files(container).count("started") == 1,
                "the cell began",
            )
            stop_process_tree(bridge.pid)  # SIGKILL, mid-cell
    assert sandboxes_of(state, every=False), "the sandbox died with its bridge"

    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print('now', y)", "s")
        assert result.status == "ok" and "adopted" in result.codes, result.text
        assert result.stdout == "now 42\n", result.text  # the cell finished while no bridge was there
        assert "late 42" in result.notes, result.notes  # and its output was kept for this bridge
        await bridge.close("s")


async def test_a_client_exit_mid_cell_lets_the_cell_finish_for_the_next_bridge(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("import os, time\ny = 41", "s")).status == "ok"
        container = await bridge.container("s")
    # A client that quits mid-call: it closes the bridge's stdin without cancelling the request
    # (the SDK's client would send notifications/cancelled first, which stops the cell).
    # It ends only once its bridge is gone (however long a busy machine takes that bridge to go).
    cell = (
        "open('/workspace/started', 'w').close()\n"
        "while not os.path.exists('/workspace/go'): time.sleep(0.05)\n"
        "y += 1\nprint('late', y)"
    )
    params = serve_params(state, **DURABLE)
    call = {"name": "run_python", "arguments": {"code": cell, "session": "s", "timeout": 60}}
    async with await anyio.open_process([params.command, *params.args], env=params.env, stderr=None) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for message in (
            {"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                                         "clientInfo": {"name": "quitter", "version": "1"}}},
            {"method": "notifications/initialized"},
            {"id": 2, "method": "tools/call", "params": call},
        ):  # fmt: skip
            await proc.stdin.send((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        await wait_for(lambda: "started" in workspace_files(container), "it began")
        await proc.stdin.aclose()
        with anyio.fail_after(WAIT):
            await proc.wait()
    assert sandboxes_of(state, every=False), "the sandbox ended with its bridge"
    podman("exec", container, "touch", "/workspace/go")

    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print('now', y)", "s")
        assert result.status == "ok" and "adopted" in result.codes, result.text
        assert result.stdout == "now 42\n" and "late 42" in result.notes, result.text
        journal = [json.loads(line) for line in bridge.journal("s").read_text().splitlines() if line]
        codes = [entry.get("code", "") for entry in journal if entry.get("type") == "cell"]
        assert [code.count("/workspace/go") for code in codes] == [0, 1, 0], codes  # journalled once
        await bridge.close("s")


async def test_sigkill_mid_idle_then_a_new_bridge(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("z = [1, 2, 3]", "s")).status == "ok"
        os.kill(bridge.pid, signal.SIGKILL)
        for child in children(bridge.pid):
            stop_process_tree(child)
    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print(sum(z))", "s")
        assert result.stdout == "6\n" and "adopted" in result.codes, result.text
        await bridge.close("s")


@asynccontextmanager
async def second_bridge(state_dir: Path, first: Bridge) -> AsyncIterator[Bridge]:
    """Another bridge on ``state_dir`` while ``first`` runs."""
    async with Client(serve_params(state_dir, **DURABLE), read_timeout_seconds=CLIENT_TIMEOUT) as client:
        (pid,) = [pid for pid in serve_pids(state_dir) if pid != first.pid]
        yield Bridge(client, state_dir, pid)


async def test_a_second_bridge_on_the_state_directory_never_takes_a_held_session(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as one, second_bridge(state, one) as two:
        assert (await one.run("w = 'one'", "s")).status == "ok"
        error, text = await two.call("run_python", code="w = 'two'", session="s")
        assert error and "held by another kernelbridge" in text and "\n" not in text.strip(), text
        listed = await two.listed()
        assert listed["s"]["state"] == "attached" and listed["s"]["elsewhere"], listed
        mine = await two.run("print('own session')", "t")  # its own sessions work
        assert mine.status == "ok", mine.text
        assert (await one.run("print(w)", "s")).stdout == "one\n"
        await one.close("s")
        await two.close("t")


async def test_a_forged_adoption_is_refused_and_the_session_goes_on_fresh(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("secret_value = 1", "s")).status == "ok"
    forge_secret(state, "s")  # a well-formed secret, not the sandbox's
    async with open_bridge(state, **DURABLE) as bridge:
        refused = await bridge.run("print('hello')", "s")
        assert "sandbox_lost" in refused.codes and refused.data["state"] == "lost", refused.text
        assert "secret" in refused.notes and "restore=" in refused.notes, refused.notes
        fresh = await bridge.run("print('secret_value' in globals())", "s")
        assert fresh.status == "ok" and fresh.stdout == "False\n", fresh.text
        await bridge.close("s")


async def test_a_detached_sandbox_ends_itself_after_its_idle_timeout(state: Path) -> None:
    async with open_bridge(state, **DURABLE, KERNELBRIDGE_IDLE_TIMEOUT="3") as bridge:
        assert (await bridge.run("v = 1", "s")).status == "ok"
    # Not even an exited container is left: the engine removed it, with no bridge there.
    await wait_for(lambda: not sandboxes_of(state), "it ended itself and was removed with no bridge")
    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print('v' in globals())", "s")
        assert "sandbox_lost" in result.codes and "idle timeout" in result.notes, result.text
        assert "restore=" in result.notes
        fresh = await bridge.run("print('v' in globals())", "s")
        assert fresh.stdout == "False\n", fresh.text
        await bridge.close("s")


async def test_after_a_machine_restart_the_session_says_so_and_offers_restore(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("u = 5\nprint(u)", "s")).status == "ok"
    podman("rm", "-f", "-t", "0", *sandboxes_of(state, warm=True), timeout=120)  # what a reboot leaves
    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print(u)", "s")
        assert result.status != "ok" and "sandbox_lost" in result.codes, result.text
        assert "gone" in result.notes and "restore=" in result.notes, result.notes
        restore = result.notes.split("restore='", 1)[1].split("'", 1)[0]
        assert restore == "kernelbridge://sessions/s@1/notebook", restore
        restored = await bridge.run("print(u)", "s", restore=restore)  # rebuilt in place
        assert restored.status == "ok" and restored.stdout == "5\n", restored.text
        await bridge.close("s")


@asynccontextmanager
async def time_bridge(state_dir: Path, servers: Path, **env: str) -> AsyncIterator[Bridge]:
    """A durable bridge with the ``time`` host MCP server (mcp-server-time) configured."""
    params = serve_params(state_dir, "--servers-config", str(servers), **DURABLE, **env)
    async with Client(params, read_timeout_seconds=CLIENT_TIMEOUT) as client:
        (pid,) = serve_pids(state_dir)
        yield Bridge(client, state_dir, pid)


async def test_auto_restore_rebuilds_a_lost_session_with_its_recorded_tool_results(
    state: Path, tmp_path: Path
) -> None:
    servers = tmp_path / "servers.json"
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
    servers.write_text(json.dumps({"mcpServers": {"time": time_server}}))
    ask = "(await mcp_time.get_current_time(timezone='UTC'))['structuredContent']['datetime']"
    async with time_bridge(state, servers) as bridge:
        made = await bridge.run(f"then = {ask}\nu = 5\nprint(then)", "s", servers=["time"])
        assert made.status == "ok", made.text
        then = made.stdout.strip()
    podman("rm", "-f", "-t", "0", *sandboxes_of(state, warm=True), timeout=120)  # what a reboot leaves
    async with time_bridge(state, servers, KERNELBRIDGE_AUTO_RESTORE="1") as bridge:
        result = await bridge.run(f"print(u, then)\nprint({ask} != then)", "s")
        # Rebuilt first, the tool call answered from the journal (a live one tells a later time).
        assert result.status == "ok" and result.stdout == f"5 {then}\nTrue\n", result.text
        assert result.codes[:2] == ["sandbox_lost", "restored"], result.codes
        assert "re-run from its journal" in result.notes, result.notes
        assert "answered from the recording" in result.notes, result.notes
        await bridge.close("s")


async def test_durable_off_restores_sessions_that_end_with_their_bridge(state: Path) -> None:
    async with open_bridge(state, KERNELBRIDGE_DURABLE="0") as bridge:
        assert (await bridge.run("q = 1", "s")).status == "ok"
        container = await bridge.container("s")
    assert not podman("ps", "-a", "-q", "--filter", f"name={container}").split()
    assert SessionStore(state).current("s") is not None and not SessionStore(state).current("s").durable


async def test_a_record_copied_to_another_state_directory_adopts_nothing(state: Path, tmp_path: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("mine = 1", "s")).status == "ok"
    other = tmp_path / "other"
    shutil.copytree(state / "sessions", other / "sessions")  # the record and the secret
    async with open_bridge(other, **DURABLE) as thief:
        stolen = await thief.run("print('mine' in globals())", "s")
        assert "sandbox_lost" in stolen.codes and "not this session's" in stolen.notes, stolen.text
        fresh = await thief.run("print('mine' in globals())", "s")
        assert fresh.stdout == "False\n", fresh.text
        await thief.close("s")
    async with open_bridge(state, **DURABLE) as bridge:  # the real owner still adopts it
        mine = await bridge.run("print(mine)", "s")
        assert mine.stdout == "1\n" and "adopted" in mine.codes, mine.text
        await bridge.close("s")


async def test_sandbox_code_cannot_hand_the_agent_a_host_of_its_own(state: Path) -> None:
    """Kernel code (uid 65534) connects to the agent's attach point and passes pipes: the agent
    hangs up before reading a byte, and the session's own bridge is unaffected."""
    probe = """
import array, os, socket
verdict = {}
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect("\\0kernelbridge-agent")
r, w = os.pipe()
try:
    s.sendmsg([b"H"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, w]))])
    verdict["answer"] = s.recv(1).decode()
except OSError as exc:
    verdict["answer"] = type(exc).__name__
os.write(w, b'{"type": "hello"}\\n')
"""
    async with open_bridge(state, **DURABLE) as bridge:
        found = await bridge.probe(probe, "s")
        assert found["answer"] in ("", "ConnectionResetError", "BrokenPipeError"), found
        assert (await bridge.run("print('still mine')", "s")).stdout == "still mine\n"
        await bridge.close("s")


async def test_an_http_restart_gives_each_token_only_its_own_sessions(state: Path) -> None:
    tokens = {"alice": "a" * 32, "bob": "b" * 32}
    async with open_http_bridge(state, tokens, **DURABLE) as bridges:
        assert (await bridges["alice"].run("who = 'alice'", "default")).status == "ok"
        assert (await bridges["bob"].run("who = 'bob'", "default")).status == "ok"
        assert (await bridges["bob"].run("extra = 1", "bobs")).status == "ok"
    # SIGTERM (open_http_bridge's exit): every sandbox detached, none stopped.
    await wait_for(lambda: len(sandboxes_of(state / "http" / "alice", every=False)) == 1, "alice's runs on")
    await wait_for(lambda: len(sandboxes_of(state / "http" / "bob", every=False)) == 2, "bob's run on")
    async with open_http_bridge(state, tokens, **DURABLE) as bridges:
        alice, bob = bridges["alice"], bridges["bob"]
        assert set(await alice.listed()) == {"default"}, await alice.listed()
        assert set(await bob.listed()) == {"default", "bobs"}
        said = await alice.run("print(who)", "default")
        assert said.stdout == "alice\n" and "adopted" in said.codes, said.text
        bobs = await bob.run("print(who)", "default")
        assert bobs.stdout == "bob\n", bobs.text
        assert (await alice.run("print('extra' in globals())", "bobs")).stdout == "False\n"
        for bridge, names in ((alice, ["default", "bobs"]), (bob, ["default", "bobs"])):
            for name in names:
                await bridge.close(name)


async def test_a_new_bridge_adopts_the_warm_pool_of_the_one_before(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        await wait_for(lambda: pool_filled(state), "the pool filled: its sandbox ready")
        (pooled,) = sandboxes_of(state, every=False, warm=True)
        assert bridge.sessions == set()
    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print('warm')", "s")
        assert result.status == "ok", result.text
        container = podman("inspect", "--format", "{{.Id}}", await bridge.container("s")).strip()
        assert container.startswith(pooled), (container, pooled)  # the one the bridge before started
        await bridge.close("s")


@pytest.fixture
def other_image(sandbox_image: str) -> Iterator[str]:
    """The sandbox image under another reference, as a rebuilt image (other packages, or a new
    kernelbridge's agent) is: a default image's tag names its contents."""
    tag = f"localhost/kernelbridge-test-other:{os.getpid()}"
    podman("tag", sandbox_image, tag)
    yield tag
    podman("rmi", tag)


async def test_a_warm_sandbox_of_another_image_is_not_adopted(
    state: Path, sandbox_image: str, other_image: str
) -> None:
    """The next bridge starts another image than the one before: that bridge's warm sandbox is
    removed, and a new session gets the image the bridge starts, not the old one."""
    # The image setting is what this test changes: the first bridge starts the other reference.
    async with open_bridge(state, KERNELBRIDGE_IMAGE=other_image):
        await wait_for(lambda: pool_filled(state), "the pool filled: its sandbox ready")
        (stale,) = sandboxes_of(state, every=False, warm=True)
    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print('fresh')", "s")
        assert result.status == "ok", result.text
        container = await bridge.container("s")
        assert podman("inspect", "--format", "{{.ImageName}}", container).strip() == sandbox_image
        gone = lambda: stale not in podman("ps", "-a", "-q", "--no-trunc").split()  # noqa: E731
        await wait_for(gone, "the other image's warm sandbox removed")
        await bridge.close("s")


async def test_a_kernel_that_dies_while_detached_is_said_by_the_next_bridge(state: Path) -> None:
    async with open_bridge(state, **DURABLE) as bridge:
        armed = await bridge.run("import os, threading\nthreading.Timer(4, os._exit, (3,)).start()", "s")
        assert armed.status == "ok", armed.text
    stored = SessionStore(state).current("s")
    assert stored is not None and stored.detached is not None  # it was let go of before the kernel died
    await wait_for(lambda: not sandboxes_of(state, every=False), "the sandbox ended with its kernel")
    async with open_bridge(state, **DURABLE) as bridge:
        result = await bridge.run("print('fresh')", "s")
        assert "sandbox_lost" in result.codes, result.text
        assert "its kernel died while no bridge was attached" in result.notes, result.notes
        assert (await bridge.run("print('fresh')", "s")).stdout == "fresh\n"
        await bridge.close("s")
    assert not sandboxes_of(state), "the dead sandbox was removed once its loss was said"


async def test_the_cli_backend_says_so_in_doctor_and_keeps_sessions_ending_with_their_bridge(
    state: Path,
) -> None:
    cli = {**DURABLE, "KERNELBRIDGE_RUNTIME": "podman-cli"}
    doctor = await anyio.run_process([KERNELBRIDGE, "doctor"], env={**cli_env(state), **cli}, check=False)
    lines = doctor.stdout.decode().splitlines()
    (durable,) = [line for line in lines if line.split()[1:2] == ["durable"]]
    assert durable.startswith("warn") and "sessions end with their bridge" in durable, durable
    async with open_bridge(state, **cli) as bridge:
        assert (await bridge.run("c = 1", "s")).status == "ok"
        container = await bridge.container("s")
    assert not podman("ps", "-a", "-q", "--filter", f"name={container}").split()
    stored = SessionStore(state).current("s")
    assert stored is not None and not stored.durable and stored.ended is not None


async def test_kernel_code_cannot_read_its_sandboxs_secret(state: Path) -> None:
    """The secret travels once in the first hello and lives in the agent's memory (non-dumpable)
    and in a 0600 file on the host: not in any environment, argv or file the kernel can read."""
    probe = """
import os
verdict = {"found": [], "refused": []}
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for what in ("environ", "cmdline", "mem", "fd/0"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                data = f.read(1 << 20)
        except OSError:
            verdict["refused"].append(f"{pid}/{what}")
            continue
        if SECRET in data:
            verdict["found"].append(f"{pid}/{what}")
verdict["env"] = any(SECRET.decode() in v for v in os.environ.values())
"""
    async with open_bridge(state, **DURABLE) as bridge:
        assert (await bridge.run("print('hi')", "s")).status == "ok"
        secret_path = secret_file(state, "s")
        assert secret_path.stat().st_mode & 0o777 == 0o600
        secret = secret_path.read_text()
        found = await bridge.probe(f"SECRET = {secret.encode()!r}\n" + probe, "s")
        assert found["found"] == [] and found["env"] is False, found
        assert "1/mem" in found["refused"] and "1/environ" in found["refused"], found
        await bridge.close("s")
