"""The agent's kernel process against stub processes (small Python programs standing in for
ipykernel): the stop escalation, the restart's group kill, interrupts, the output pipe, and the
argv that loads ``kernelbridge/inside/kernel/`` into the real kernel."""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbridge.inside.agent import kernel_process
from kernelbridge.inside.agent.kernel_process import KernelProcess, describe_exit, kernel_argv

BOUND = 10.0  # seconds: no wait in these tests may take longer


def stub(code: str, before: list[str] | None = None) -> KernelProcess:
    """A stub kernel running ``code`` (in its own session, as the agent starts the kernel),
    returned once it has printed ``ready``; the lines it printed before go to ``before``."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    fd, line = process.stdout.fileno(), b""
    deadline = time.monotonic() + BOUND
    while line != b"ready":
        # Byte by byte from the fd: a buffered reader would keep what follows from read_output.
        assert select.select([fd], [], [], deadline - time.monotonic())[0], "the stub did not start"
        byte = os.read(fd, 1)
        assert byte, "the stub ended before it was ready"
        if byte != b"\n":
            line += byte
            continue
        if before is not None and line != b"ready":
            before.append(line.decode())
        line = b"" if line != b"ready" else line
    return KernelProcess(process)


@pytest.fixture
def stubs() -> Iterator[list[KernelProcess]]:
    started: list[KernelProcess] = []
    yield started
    for kernel in started:
        kernel.kill_group()
        kernel.close()


def output_until(kernel: KernelProcess, wanted: str) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + BOUND
    while wanted not in lines and time.monotonic() < deadline:
        select.select([kernel.output_fd], [], [], 0.1)
        lines += kernel.read_output()
    return lines


def test_stop_is_a_sigterm_for_a_kernel_that_obeys_it(stubs: list[KernelProcess]) -> None:
    kernel = stub("import time\nprint('ready', flush=True)\ntime.sleep(60)")
    stubs.append(kernel)
    kernel.stop(grace=BOUND)
    assert kernel.returncode == -signal.SIGTERM  # not SIGKILL: it did not wait out the grace


def test_stop_escalates_to_sigkill_after_the_grace(stubs: list[KernelProcess]) -> None:
    kernel = stub(
        """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print('ignored SIGTERM', flush=True))
        print('ready', flush=True)
        while True:
            time.sleep(60)
        """
    )
    stubs.append(kernel)
    kernel.stop(grace=1.0)
    assert kernel.returncode == -signal.SIGKILL
    assert "SIGKILL" in repr(kernel)
    assert kernel.read_output() == ["ignored SIGTERM"]  # asked first; killed once the grace passed


@pytest.mark.timeout(60)  # a stop that waited out its 600 s grace runs into this
def test_stop_of_an_ended_kernel_returns_at_once(stubs: list[KernelProcess]) -> None:
    kernel = stub("print('ready', flush=True)\nraise SystemExit(3)")
    stubs.append(kernel)
    deadline = time.monotonic() + BOUND
    while kernel.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    kernel.stop(grace=600)
    assert kernel.returncode == 3


def test_kill_group_takes_the_kernels_subprocesses_too(stubs: list[KernelProcess]) -> None:
    before: list[str] = []
    kernel = stub(
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(child.pid, flush=True)
        print('ready', flush=True)
        time.sleep(60)
        """,
        before,
    )
    stubs.append(kernel)
    child = int(before[0])
    assert _alive(child)
    kernel.kill_group()
    assert kernel.returncode == -signal.SIGKILL
    deadline = time.monotonic() + BOUND
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the kernel's subprocess outlived the restart"


def test_interrupt_reaches_the_kernel(stubs: list[KernelProcess]) -> None:
    kernel = stub(
        """
        import signal, time
        signal.signal(signal.SIGINT, lambda *_: print('interrupted', flush=True))
        print('ready', flush=True)
        time.sleep(60)
        """
    )
    stubs.append(kernel)
    kernel.interrupt()
    assert "interrupted" in output_until(kernel, "interrupted")


@pytest.mark.timeout(60)  # a read that waited for the kernel's 600 s sleep runs into this
def test_the_output_pipe_gives_non_blank_lines_and_never_blocks(stubs: list[KernelProcess]) -> None:
    kernel = stub(
        "import time\nprint('ready', flush=True)\nprint('a\\n\\n   \\nb', flush=True)\ntime.sleep(600)"
    )
    stubs.append(kernel)
    assert output_until(kernel, "b") == ["a", "b"]
    assert os.get_blocking(kernel.output_fd) is False
    assert kernel.read_output() == []  # nothing written: no wait


def test_describe_exit() -> None:
    assert describe_exit(None) == "still running"
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(-signal.SIGKILL).startswith("killed by SIGKILL")


def test_the_argv_loads_the_inside_kernel_modules() -> None:
    argv = kernel_argv("/tmp/k.json", python=("py", "-X", "opt"))
    assert argv[:6] == ["py", "-X", "opt", "-m", "ipykernel_launcher", "-f"] and argv[6] == "/tmp/k.json"
    flags = dict(flag.split("=", 1) for flag in argv[7:])
    named = [
        flags["--IPKernelApp.kernel_class"].rsplit(".", 1),
        flags["--IPKernelApp.outstream_class"].rsplit(".", 1),
    ]
    extensions = json.loads(flags["--IPKernelApp.extensions"])
    assert "mcp._ipython" in extensions
    # %pip comes after the mcp package's extension: its magic uses the rpc channel that one opens.
    assert extensions.index("kernelbridge.inside.kernel.pip_magic") > extensions.index("mcp._ipython")
    for module, name in named:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        assert f"class {name}(" in Path(spec.origin).read_text()
    for module in extensions:
        if module != "mcp._ipython":
            assert importlib.util.find_spec(module) is not None, module
    # mcp._ipython is found on the kernel's PYTHONPATH, never in this (host) process's.
    assert (kernel_process.PYTHONPATH_DIR / "mcp" / "_ipython.py").is_file()


def test_the_connection_file_is_private_and_names_five_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    info = kernel_process.write_connection_file(b"s3cret")
    path = Path(info.pop("path"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == info
    assert info["key"] == "s3cret" and info["ip"] == "127.0.0.1"
    ports = [info[name] for name in kernel_process.CONNECTION_PORTS]
    assert len(set(ports)) == 5


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended as far as we care)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
