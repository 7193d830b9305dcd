"""The host's pip, run for the sandbox: resolve, download, and say in one line why it failed.

Three commands, each ``python -m pip`` of the bridge's own environment, with the operator's pip
configuration (index, mirrors, proxies, certificates: "the host's index") and always
:data:`~kernelbridge.image.target.PIP_TARGET_FLAGS` (binary wheels for the sandbox's platform):

- :func:`resolve`: ``pip install --dry-run --report`` into an empty target, with the sandbox's
  installed distributions as constraints: what would be installed, each wheel with its URL and
  sha256, nothing downloaded but metadata;
- :func:`download`: ``pip download --no-deps`` of exact pins into a directory (the cache verifies
  each file's sha256 against the resolution);
- :func:`index_versions`: ``pip index versions`` of one name, to tell "no such package" from "no
  wheel for the sandbox" after a resolution found nothing (it reads file names only).

What reaches pip from the sandbox: nothing as it was sent. Requirements are ``packaging``'s
canonical re-rendering (:mod:`.requirements`), written to files of ours; the one name that goes
on a command line (:func:`index_versions`) is a validated project name. ``--only-binary=:all:``
means pip never builds a source distribution, so nothing of a package runs on the host.

Failures become :class:`PipFailure` with a :class:`Failure` kind and one line: the index cannot be
reached, no such package, no wheel for the sandbox (sdist only), a version conflict, a timeout.
Output read from pip is bounded (:data:`MAX_OUTPUT`).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
from packaging.utils import canonicalize_name

from kernelbridge.image.target import PIP_TARGET_FLAGS

log = logging.getLogger(__name__)

MAX_OUTPUT = 1024 * 1024
"""Bytes of pip's stdout and stderr kept each (pip prints a line per package; warnings repeat)."""
RESOLVE_TIMEOUT = 120.0
"""Bound on one resolution: pip fetches an index page and a metadata file per candidate."""
DOWNLOAD_TIMEOUT = 600.0
"""Bound on downloading the wheels of one install (hundreds of MB over a slow link)."""
PROBE_TIMEOUT = 30.0
NETWORK_FLAGS = ("--retries", "1", "--timeout", "15")
"""pip's defaults (5 retries, a 15 s socket timeout each, or the operator's PIP_DEFAULT_TIMEOUT)
make an unreachable index take minutes to say so; a cell waits for this."""
_NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Max retries exceeded|Connection refused"
    r"|Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|ConnectTimeoutError|ReadTimeoutError|SSLError|ProxyError|HTTP error (?:5\d\d|404)"
    r"|Could not fetch URL|No route to host",
)
_NOT_FOUND = re.compile(r"No matching distribution found for (\S+)")
_CONFLICT_START = "The conflict is caused by:"


class Failure(enum.Enum):
    """Why pip could not give the sandbox what it asked for."""

    INDEX_DOWN = "index_down"
    NOT_FOUND = "not_found"
    """No distribution of that name or version on the index, or none with a wheel for the sandbox."""
    CONFLICT = "conflict"
    TIMEOUT = "timeout"
    FAILED = "failed"
    """Anything else (pip's last error line says what)."""


class PipFailure(Exception):
    """A pip command failed; ``kind`` says how, ``message`` is one line (no host path in it)."""

    def __init__(self, kind: Failure, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.name = name
        """The project pip could not find (NOT_FOUND), as pip printed it."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """One wheel of a resolution."""

    name: str
    """Normalized (PEP 503)."""
    version: str
    filename: str
    url: str
    sha256: str
    requested: bool
    """Named by the install itself (not a dependency)."""


def pip_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the host's pip: the bridge's (the operator's pip configuration, proxies,
    certificates), without a host constraints file, never prompting."""
    env = dict(os.environ if base is None else base)
    # A constraints file of the host (e.g. /etc/xdg/pip) constrains the host's environment, not the
    # sandbox's; pip reads PIP_CONSTRAINT before its config files, so an empty one disables it.
    env["PIP_CONSTRAINT"] = ""
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    return env


def pip_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args]


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


async def run_pip(argv: list[str], *, timeout: float, env: Mapping[str, str] | None = None) -> Outcome:
    """Run one pip command, reading at most MAX_OUTPUT of each stream. Raises PipFailure TIMEOUT
    past ``timeout`` (the process is killed); cancelling the caller kills it too."""
    outputs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    async def drain(stream: anyio.abc.ByteReceiveStream | None, into: bytearray) -> None:
        if stream is None:
            return
        async for chunk in stream:
            if len(into) < MAX_OUTPUT:
                into += chunk[: MAX_OUTPUT - len(into)]

    try:
        process = await anyio.open_process(argv, env=dict(env or pip_env()), stdin=None)
    except OSError as exc:
        raise PipFailure(Failure.FAILED, f"the host's pip could not start ({exc.strerror or exc})") from None
    async with process:
        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(drain, process.stdout, outputs["stdout"])
                    tg.start_soon(drain, process.stderr, outputs["stderr"])
                returncode = await process.wait()
        except TimeoutError:
            process.kill()
            raise PipFailure(Failure.TIMEOUT, f"the host's pip did not finish within {timeout:g} s") from None
        except BaseException:
            process.kill()  # cancelled (the cell timed out): pip must not run on
            raise
    return Outcome(
        returncode,
        outputs["stdout"].decode(errors="replace"),
        outputs["stderr"].decode(errors="replace"),
    )


def classify(outcome: Outcome) -> PipFailure:
    """The one-line reason a failed pip command gives (network, not found, conflict, other)."""
    text = outcome.stderr + "\n" + outcome.stdout
    if "No module named pip" in text:
        return PipFailure(
            Failure.FAILED,
            "the host has no pip in kernelbridge's Python environment (install pip there:"
            " `python -m ensurepip`); nothing was installed",
        )
    network = _NETWORK_ERRORS.search(text)
    if network is not None:
        return PipFailure(
            Failure.INDEX_DOWN,
            f"the host's package index could not be reached ({network.group(0)}); nothing was installed",
        )
    if _CONFLICT_START in outcome.stdout or "ResolutionImpossible" in text:
        return PipFailure(Failure.CONFLICT, "version conflict: " + _conflict(outcome.stdout))
    found = _NOT_FOUND.search(text)
    if found is not None:
        return PipFailure(
            Failure.NOT_FOUND, f"no distribution found for {found.group(1)}", name=found.group(1)
        )
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("ERROR:")]
    last = errors[-1][6:].strip() if errors else f"exit status {outcome.returncode}"
    return PipFailure(Failure.FAILED, f"the host's pip failed: {last[:300]}")


def _conflict(stdout: str) -> str:
    """pip's "The conflict is caused by:" lines in one line, constraints said as what the sandbox has."""
    lines = stdout.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _CONFLICT_START)
    except StopIteration:
        return "the requirements cannot be installed together with what the sandbox has"
    causes = []
    for line in lines[start + 1 :]:
        line = line.strip()
        if not line:
            break
        # Constraints are the sandbox's own distributions (see resolve()).
        constraint = re.match(r"The user requested \(constraint\) (\S+?)==(\S+)", line)
        if constraint:
            line = f"the sandbox has {constraint.group(1)} {constraint.group(2)}"
        else:
            line = line.replace("The user requested", "you asked for")
        causes.append(line)
        if len(causes) >= 6:
            break
    return "; ".join(causes)[:600] or "the requirements conflict"


async def resolve(
    requirements: list[str], constraints: dict[str, str], work: Path, *, env: Mapping[str, str] | None = None
) -> list[Resolved]:
    """What pip would install for ``requirements`` (canonical lines) next to ``constraints`` (the
    sandbox's distributions, ``{name: version}``), for the sandbox's platform. Raises PipFailure."""
    requirements_file, constraints_file = await anyio.to_thread.run_sync(
        _write_inputs, work, requirements, constraints
    )
    report = work / "report.json"
    argv = pip_argv(
        "install", "--dry-run", "--ignore-installed", "--no-warn-conflicts", "--report", str(report),
        "--target", str(work / "target"), *PIP_TARGET_FLAGS, *NETWORK_FLAGS,
        "--requirement", str(requirements_file), "--constraint", str(constraints_file),
    )  # fmt: skip
    outcome = await run_pip(argv, timeout=RESOLVE_TIMEOUT, env=env)
    if outcome.returncode != 0:
        raise classify(outcome)
    try:
        data = json.loads(report.read_text())
        return [_resolved(item) for item in data["install"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PipFailure(Failure.FAILED, f"the host's pip wrote no usable report ({exc})") from None


def _write_inputs(work: Path, requirements: list[str], constraints: dict[str, str]) -> tuple[Path, Path]:
    """The requirements and constraints files of a resolution (lines of ours, never the sandbox's)."""
    work.mkdir(parents=True, exist_ok=True)
    requirements_file, constraints_file = work / "requirements.txt", work / "constraints.txt"
    requirements_file.write_text("".join(f"{line}\n" for line in requirements))
    lines = [f"{name}=={version}\n" for name, version in sorted(constraints.items())]
    constraints_file.write_text("".join(lines))
    return requirements_file, constraints_file


def _write_pins(dest: Path, pins: list[Resolved]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / "pins.txt"
    requirements.write_text("".join(f"{pin.name}=={pin.version}\n" for pin in pins))
    return requirements


def _resolved(item: dict[str, object]) -> Resolved:
    metadata, info = item["metadata"], item["download_info"]
    assert isinstance(metadata, dict) and isinstance(info, dict)
    url = str(info["url"])
    if item.get("is_direct"):
        # A direct URL never comes from an index listing: only from metadata of a wheel (PyPI
        # refuses such uploads; a private index may not), and the sandbox's own are refused earlier.
        raise PipFailure(Failure.FAILED, f"{metadata['name']} would come from a direct URL; refused")
    filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
    if not filename.endswith(".whl"):
        raise PipFailure(Failure.FAILED, f"{metadata['name']} resolved to {filename[:80]}, not a wheel")
    hashes = (
        info.get("archive_info", {}).get("hashes", {}) if isinstance(info.get("archive_info"), dict) else {}
    )
    sha256 = hashes.get("sha256", "") if isinstance(hashes, dict) else ""
    return Resolved(
        name=canonicalize_name(str(metadata["name"])),
        version=str(metadata["version"]),
        filename=filename,
        url=url,
        sha256=str(sha256),
        requested=bool(item.get("requested")),
    )


async def download(pins: list[Resolved], dest: Path, *, env: Mapping[str, str] | None = None) -> None:
    """Download the wheels of ``pins`` (exact versions, no dependencies) into ``dest``. The caller
    verifies names and hashes. Raises PipFailure."""
    requirements = await anyio.to_thread.run_sync(_write_pins, dest, pins)
    argv = pip_argv(
        "download", "--no-deps", "--dest", str(dest), *PIP_TARGET_FLAGS, *NETWORK_FLAGS,
        "--requirement", str(requirements),
    )  # fmt: skip
    outcome = await run_pip(argv, timeout=DOWNLOAD_TIMEOUT, env=env)
    if outcome.returncode != 0:
        raise classify(outcome)


async def index_versions(name: str, *, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The versions the host's index lists for ``name`` from any file, wheel or source (None: it
    does not know the project). ``pip index`` reads file names only: nothing is built."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
        return None
    outcome = await run_pip(
        pip_argv("index", "versions", *NETWORK_FLAGS, name), timeout=PROBE_TIMEOUT, env=env
    )
    if outcome.returncode != 0:
        return None
    match = re.search(r"Available versions: (.*)", outcome.stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []
