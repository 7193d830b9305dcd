"""The host's pip, run for the sandbox: resolve, and say in one line why it failed.

:func:`resolve` is ``pip install --dry-run --report`` into an empty target with the sandbox's
distributions as constraints (what would be installed, each wheel with its URL and sha256; the
wheels are fetched by :mod:`.fetch`); :func:`index_versions` is ``pip index versions`` of one
name, to tell "no such package" from "no wheel for the sandbox". Both always pass
:data:`~kernelbridge.image.target.PIP_TARGET_FLAGS` (binary wheels for the sandbox's platform, so
nothing of a package runs on the host), only :mod:`.requirements`' renderings after ``--``, pip's
own environment (:func:`pip_env`) and a work directory of the cache as ``TMPDIR`` that
:func:`run_pip` bounds (docs/architecture.md, "Packages and data"). Failures are a
:class:`PipFailure` of a :class:`Failure` kind, one line without host paths or URLs; what it
quotes of pip's bounded output is scrubbed (:func:`scrub`).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
from packaging.utils import canonicalize_name

from kernelbridge.image.target import PIP_TARGET_FLAGS
from kernelbridge.packages.requirements import is_rendered

log = logging.getLogger(__name__)

MAX_OUTPUT = 1024 * 1024
"""Bytes of pip's stdout and stderr kept each (pip prints a line per package; warnings repeat)."""
MAX_QUOTED = 300
"""Characters of pip's own words a message quotes (scrubbed)."""
RESOLVE_TIMEOUT = 120.0
"""Bound on one resolution: pip fetches an index page and a metadata file per candidate."""
PROBE_TIMEOUT = 30.0
GUARD_INTERVAL = 0.05
"""Seconds between two measures of pip's work directory: at 1 GB/s from a local mirror, 50 MB
past the limit at worst, and no single file past it (``RLIMIT_FSIZE``)."""
NETWORK_FLAGS = ("--retries", "1", "--timeout", "15")
"""pip's defaults (5 retries, a 15 s socket timeout each, or the operator's PIP_DEFAULT_TIMEOUT)
make an unreachable index take minutes to say so; a cell waits for this."""
ENVIRONMENT_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "SYSTEMROOT",
        "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS",  # where pip's configuration files are
        "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
        "http_proxy", "https_proxy", "all_proxy", "no_proxy",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC",
    }
)  # fmt: skip
"""What the host's pip gets of the bridge's environment, besides ``PIP_*`` and ``LC_*``: its
configuration, proxies and certificates. Nothing else: the bridge's environment holds secrets
(``KERNELBRIDGE_HTTP_TOKENS``, the MCP client's API keys) that pip has no use for."""
ENVIRONMENT_PREFIXES = ("PIP_", "LC_")
_LAUNCH = """\
import os, resource, runpy, signal, sys
limit, parent = int(sys.argv.pop(1)), int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: a file at the limit ends pip
if sys.platform == "linux":
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: pip ends with the bridge
    if os.getppid() != parent:
        sys.exit(1)
sys.argv[0] = "pip"
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""
"""``python -c`` that bounds every file pip writes and ties pip's life to the bridge's, then runs
pip (no preexec hook in anyio's open_process)."""
_NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Max retries exceeded|Connection refused"
    r"|Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|ConnectTimeoutError|ReadTimeoutError|SSLError|ProxyError|HTTP error (?:5\d\d|404)"
    r"|Could not fetch URL|No route to host",
)
_NOT_FOUND = re.compile(r"No matching distribution found for ([A-Za-z0-9][A-Za-z0-9._-]*)")
_CONFLICT_START = "The conflict is caused by:"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_PATH = re.compile(r"(?<![\w.~-])(?:/|~/)[^\s'\",;:)]*")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


class Failure(enum.Enum):
    """Why pip could not give the sandbox what it asked for."""

    INDEX_DOWN = "index_down"
    NOT_FOUND = "not_found"
    """No distribution of that name or version on the index, or none with a wheel for the sandbox."""
    CONFLICT = "conflict"
    TOO_LARGE = "too_large"
    """pip wrote more than its limit (downloads to read metadata, on an index without PEP 658)."""
    TIMEOUT = "timeout"
    FAILED = "failed"
    """Anything else (pip's last error line says what, scrubbed)."""


class PipFailure(Exception):
    """A pip command failed; ``kind`` says how, ``message`` is one line (no host path in it)."""

    def __init__(self, kind: Failure, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.name = name
        """The normalized name of the project pip could not find (NOT_FOUND)."""


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
    """The environment of the host's pip: of the bridge's (``base``), only pip's configuration,
    proxies and certificates (:data:`ENVIRONMENT_NAMES`, ``PIP_*``); no host constraints file,
    never prompting, never caching (every byte pip writes goes to its work directory)."""
    source = os.environ if base is None else base
    env = {
        key: value
        for key, value in source.items()
        if key in ENVIRONMENT_NAMES or key.startswith(ENVIRONMENT_PREFIXES)
    }
    # A constraints file of the host (e.g. /etc/xdg/pip) constrains the host's environment, not the
    # sandbox's; pip reads PIP_CONSTRAINT before its config files, so an empty one disables it.
    env["PIP_CONSTRAINT"] = ""
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    env.pop("PIP_CACHE_DIR", None)  # --no-cache-dir on every command
    return env


def pip_argv(limit: int, *args: str) -> list[str]:
    """``python -m pip ARGS`` with every file it writes bounded by ``limit`` bytes (:data:`_LAUNCH`)."""
    return [sys.executable, "-c", _LAUNCH, str(max(limit, 1)), str(os.getpid()), "--no-cache-dir", *args]


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


async def run_pip(
    args: list[str], work: Path, *, limit: int, timeout: float, env: Mapping[str, str] | None = None
) -> Outcome:
    """Run ``pip ARGS`` with ``work`` as its TMPDIR, reading at most MAX_OUTPUT of each stream.
    Raises PipFailure TOO_LARGE once ``work`` holds more than ``limit`` bytes (or a file of pip
    reaches it), TIMEOUT past ``timeout``; pip is killed then, and when the caller is cancelled."""
    outputs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    environment = {**(pip_env() if env is None else env), "TMPDIR": str(work)}

    async def drain(stream: anyio.abc.ByteReceiveStream | None, into: bytearray) -> None:
        if stream is None:
            return
        async for chunk in stream:
            if len(into) < MAX_OUTPUT:
                into += chunk[: MAX_OUTPUT - len(into)]

    try:
        process = await anyio.open_process(pip_argv(limit, *args), env=environment, stdin=None, cwd=str(work))
    except OSError as exc:
        raise PipFailure(Failure.FAILED, f"the host's pip could not start ({exc.strerror or exc})") from None
    over = False

    async def guard() -> None:
        nonlocal over
        while True:
            await anyio.sleep(GUARD_INTERVAL)
            if await anyio.to_thread.run_sync(disk_usage, work) > limit:
                over = True
                _kill(process)
                return

    async with process:
        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(guard)
                    async with anyio.create_task_group() as streams:
                        streams.start_soon(drain, process.stdout, outputs["stdout"])
                        streams.start_soon(drain, process.stderr, outputs["stderr"])
                    returncode = await process.wait()
                    tg.cancel_scope.cancel()
        except TimeoutError:
            _kill(process)
            raise PipFailure(Failure.TIMEOUT, f"the host's pip did not finish within {timeout:g} s") from None
        except BaseException:
            _kill(process)  # cancelled (the cell timed out): pip must not run on
            raise
    if over or returncode == -signal.SIGXFSZ:
        raise PipFailure(Failure.TOO_LARGE, f"the host's pip needed more than {_mib(limit)} of downloads")
    return Outcome(
        returncode,
        outputs["stdout"].decode(errors="replace"),
        outputs["stderr"].decode(errors="replace"),
    )


def _kill(process: anyio.abc.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        process.kill()


def disk_usage(directory: Path) -> int:
    """Bytes of the files under ``directory`` (gone ones count nothing: pip removes as it goes)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def scrub(text: str) -> str:
    """pip's words made fit to quote to the sandbox: one line, no URL (an index URL may hold
    credentials), no host path, printable ASCII, capped."""
    text = _URL.sub("<url>", text)
    text = _PATH.sub("<path>", text)
    text = _UNPRINTABLE.sub(" ", text)
    return " ".join(text.split())[:MAX_QUOTED]


def classify(outcome: Outcome) -> PipFailure:
    """The one-line reason a failed pip command gives (network, not found, conflict, other)."""
    text = outcome.stderr + "\n" + outcome.stdout
    log.info("packages: the host's pip failed (exit %s): %s", outcome.returncode, outcome.stderr[-4000:])
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
        name = canonicalize_name(found.group(1))
        return PipFailure(Failure.NOT_FOUND, f"no distribution found for {name}", name=name)
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("ERROR:")]
    last = scrub(errors[-1][6:]) if errors else f"exit status {outcome.returncode}"
    return PipFailure(Failure.FAILED, f"the host's pip failed: {last}")


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
        causes.append(scrub(line))
        if len(causes) >= 6:
            break
    return "; ".join(causes)[:600] or "the requirements conflict"


def _checked(lines: list[str]) -> list[str]:
    """``lines`` if every one is a rendering of :mod:`.requirements`; a bug otherwise (refused)."""
    bad = [line for line in lines if not is_rendered(line)]
    if bad:
        raise PipFailure(Failure.FAILED, "a requirement was not rendered for pip; refused")
    return lines


async def resolve(
    requirements: list[str],
    constraints: dict[str, str],
    work: Path,
    *,
    limit: int,
    no_deps: bool = False,
    env: Mapping[str, str] | None = None,
) -> list[Resolved]:
    """What pip would install for ``requirements`` (rendered lines) next to ``constraints`` (the
    sandbox's distributions, ``{name: version}``), for the sandbox's platform; ``no_deps``: exactly
    those pins. pip writes at most ``limit`` bytes into ``work``. Raises PipFailure."""
    pins = _checked([f"{name}=={version}" for name, version in sorted(constraints.items())])
    constraints_file = work / "constraints.txt"
    await anyio.Path(constraints_file).write_text("".join(f"{line}\n" for line in pins))
    report = work / "report.json"
    args = [
        "install", "--dry-run", "--ignore-installed", "--no-warn-conflicts", "--report", str(report),
        "--target", str(work / "target"), *PIP_TARGET_FLAGS, *NETWORK_FLAGS,
        "--constraint", str(constraints_file), *(["--no-deps"] if no_deps else []),
        "--", *_checked(requirements),
    ]  # fmt: skip
    outcome = await run_pip(args, work, limit=limit, timeout=RESOLVE_TIMEOUT, env=env)
    if outcome.returncode != 0:
        raise classify(outcome)
    try:
        data = json.loads(await anyio.Path(report).read_text())
        return [_resolved(item) for item in data["install"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise PipFailure(Failure.FAILED, "the host's pip wrote no usable report") from None


def _resolved(item: dict[str, object]) -> Resolved:
    metadata, info = item["metadata"], item["download_info"]
    assert isinstance(metadata, dict) and isinstance(info, dict)
    name = canonicalize_name(str(metadata["name"]))
    url = str(info["url"])
    if item.get("is_direct"):
        # A direct URL never comes from an index listing: only from metadata of a wheel (PyPI
        # refuses such uploads; a private index may not), and the sandbox's own are refused earlier.
        raise PipFailure(Failure.FAILED, f"{name[:80]} would come from a direct URL; refused")
    filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
    if not filename.endswith(".whl"):
        raise PipFailure(Failure.FAILED, f"{name[:80]} resolved to {scrub(filename)[:80]}, not a wheel")
    hashes = (
        info.get("archive_info", {}).get("hashes", {}) if isinstance(info.get("archive_info"), dict) else {}
    )
    sha256 = hashes.get("sha256", "") if isinstance(hashes, dict) else ""
    return Resolved(
        name=name,
        version=str(metadata["version"]),
        filename=filename,
        url=url,
        sha256=str(sha256),
        requested=bool(item.get("requested")),
    )


async def index_versions(name: str, work: Path, *, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The versions the host's index lists for ``name`` (a normalized name) from any file, wheel or
    source (None: it does not know the project). ``pip index`` reads file names only."""
    if not is_rendered(name):
        return None
    args = ["index", "versions", *NETWORK_FLAGS, "--", name]
    outcome = await run_pip(args, work, limit=MAX_OUTPUT, timeout=PROBE_TIMEOUT, env=env)
    if outcome.returncode != 0:
        return None
    match = re.search(r"Available versions: (.*)", outcome.stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
