"""Packages through the host, the kernel's side: ``%pip install`` without a network.

The host resolves and downloads the wheels (docs/rpc.md, "Packages"); this module fetches them over
rpc (``packages_install``, ``packages_fetch``, ``packages_done``), checks each sha256, unpacks them
with ``installer`` into a staging directory and moves the tree into :func:`site_dir`, on ``sys.path``
ahead of the image's packages: it imports in the next line. A failure before that move removes the
staging directory and installs nothing; a failing move is undone. Packages live in :data:`ROOT`
(``/packages``, a tmpfs: a kernel restart keeps them, a new sandbox starts without them), ``site/``
and ``bin/`` (on ``PATH``). Standard library plus ``installer``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import importlib.metadata
import os
import re
import shutil
import site
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _transport
from ._errors import McpError, McpUnavailable, PackageError

ROOT_VARIABLE = "KERNELBRIDGE_PACKAGES_DIR"
ROOT = Path(os.environ.get(ROOT_VARIABLE) or "/packages")
"""The sandbox's packages tmpfs (``runtime/flags.py`` mounts it)."""
MAX_ENVIRONMENT = 2000
"""Distributions reported to the host (the host refuses more)."""
_seen_pth: set[str] = set()


_fallback: Path | None = None


def root(create: bool = False) -> Path | None:
    """Where this kernel's packages go: /packages when it is there and writable (a sandbox); else,
    with ``create``, a private temporary directory of this kernel process (an older image, a
    kernel outside a sandbox); else None."""
    global _fallback
    if ROOT.is_dir() and os.access(ROOT, os.W_OK):
        return ROOT
    if _fallback is None and create:
        import tempfile

        _fallback = Path(tempfile.mkdtemp(prefix="kernelbridge-packages-"))
    return _fallback


def site_dir() -> Path | None:
    base = root()
    return None if base is None else base / "site"


def activate() -> None:
    """Put the packages directory on ``sys.path`` (ahead of the image's packages), its scripts on
    ``PATH``, and both in the environment of the kernel's child processes. Idempotent; called at
    kernel start and after each install; nothing to do without a packages directory."""
    base = root()
    if base is None:
        return
    site_path, bin_path = base / "site", base / "bin"
    with contextlib.suppress(OSError):
        site_path.mkdir(parents=True, exist_ok=True)
    entry = str(site_path)
    if entry not in sys.path:
        # After the working directory ('' or the script's directory), before everything else.
        sys.path.insert(1 if sys.path and sys.path[0] in ("", os.getcwd()) else 0, entry)
    _prepend_env("PYTHONPATH", entry)
    _prepend_env("PATH", str(bin_path))
    _process_pth(site_path)
    importlib.invalidate_caches()


def _prepend_env(name: str, entry: str) -> None:
    parts = [part for part in os.environ.get(name, "").split(os.pathsep) if part]
    if entry not in parts:
        os.environ[name] = os.pathsep.join([entry, *parts])


def _process_pth(site_path: Path) -> None:
    """Run the .pth files installed since the last call, as the interpreter would have at start."""
    known = {os.path.normcase(p) for p in sys.path}
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(site_path)):
            if name.endswith(".pth") and name not in _seen_pth:
                _seen_pth.add(name)
                site.addpackage(str(site_path), name, known)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def environment() -> dict[str, str]:
    """{normalized name: version} of the distributions importable now (the first on sys.path wins)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:  # a broken dist-info: skip it, as pip list does
            continue
        if name and _normalize(name) not in found:
            found[_normalize(name)] = dist.version
        if len(found) >= MAX_ENVIRONMENT:
            break
    return found


@dataclass
class InstallReport:
    """What one install did."""

    installed: list[dict[str, Any]] = field(default_factory=list)
    """Wheel records (name, version, filename, sha256, size, installed_size)."""
    satisfied: list[str] = field(default_factory=list)
    """``name version`` of requirements the kernel already met."""
    source: str = ""
    """Where the host found the wheels: ``cache``, ``index``, ``recorded`` (a restore)."""
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What ``%pip install`` prints (pip's own words where they fit)."""
        out = [f"Requirement already satisfied: {item}" for item in self.satisfied]
        if self.installed:
            size = _size(sum(int(w["size"]) for w in self.installed))
            names = " ".join(f"{w['name']}-{w['version']}" for w in sorted(self.installed, key=_by_name))
            # Nothing that varies between runs (where the host found them): a replay compares it.
            out.append(f"Successfully installed {names} ({size} of wheels)")
        return out + self.notes


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 1024:.1f} KiB"


PROGRESS_BYTES = 8 * 1024 * 1024
"""Installs bigger than this say what they fetch before they do (a long cell shows its output)."""


def _by_name(record: dict[str, Any]) -> str:
    return str(record["name"])


def install(requirements: list[str], *, upgrade: bool = False, out: Any = None) -> InstallReport:
    """Install ``requirements`` through the host. Raises PackageError (or another McpError from
    the host, e.g. McpToolDenied for the policy), each with one line; nothing is left half-way."""
    __tracebackhide__ = True
    env = environment()
    try:
        answer = _transport.request(
            "packages_install",
            {
                "requirements": list(requirements),
                "environment": [f"{name}=={version}" for name, version in env.items()],
                "upgrade": upgrade,
            },
        )
    except McpUnavailable as exc:  # the bridge went away (or never was): nothing came in
        raise PackageError(f"{exc.message}; nothing was installed") from None
    report = InstallReport(
        satisfied=list(answer.get("satisfied") or []), source=str(answer.get("source", ""))
    )
    plan = answer.get("plan")
    wheels = answer.get("install") or []
    if not plan or not wheels:
        return report
    total = sum(int(w.get("size", 0)) for w in wheels)
    if out is not None and total > PROGRESS_BYTES:
        names = ", ".join(f"{w['name']}-{w['version']}" for w in wheels)
        print(f"Installing {names} ({_size(total)}) ...", file=out, flush=True)
    base = root(create=True)
    assert base is not None
    staging = base / f".staging-{uuid.uuid4().hex[:12]}"
    try:
        try:
            for wheel in wheels:  # one wheel at a time on the tmpfs: it goes once it is unpacked
                wheel_file = _fetch(plan, wheel, staging / "wheels")
                _unpack(wheel_file, staging)
                wheel_file.unlink()
            replaced = _commit(staging, base, [str(w["name"]) for w in wheels])
        except BaseException as exc:
            why = _why(exc)
            with contextlib.suppress(McpError):
                _transport.request("packages_done", {"plan": plan, "ok": False, "error": why})
            if isinstance(exc, McpUnavailable):  # the bridge went away mid-install
                raise PackageError(f"{exc.message}; nothing was installed") from None
            if isinstance(exc, McpError):
                raise
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise PackageError(f"the install failed in the sandbox ({why}); nothing was installed") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    activate()
    report.installed = list(wheels)
    try:
        _transport.request("packages_done", {"plan": plan, "ok": True})
    except McpError as exc:  # installed all the same; only the session's record misses it
        report.notes.append(f"Note: the host did not record this install ({exc.message}).")
    report.notes += _shadow_notes(wheels, env, replaced)
    return report


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, OSError) and exc.errno == 28:
        return "the packages directory is full (no space left on /packages)"
    return f"{type(exc).__name__}: {exc}"[:300]


def _safe_filename(name: object) -> str:
    text = str(name)
    if not re.match(r"^[A-Za-z0-9._+-]+\.whl$", text):
        raise PackageError(f"the host named a wheel {text[:80]!r}; refused")
    return text


def _fetch(plan: str, wheel: dict[str, Any], directory: Path) -> Path:
    """Pull one wheel from the host, chunk by chunk, and check its size and sha256; its file."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / _safe_filename(wheel["filename"])
    expected, size = str(wheel["sha256"]), int(wheel["size"])
    digest = hashlib.sha256()
    offset = 0
    with target.open("wb") as stream:
        while offset < size:
            chunk = _transport.request("packages_fetch", {"plan": plan, "sha256": expected, "offset": offset})
            data = base64.b64decode(chunk["data"], validate=True)
            if not data or offset + len(data) > size:
                raise PackageError(f"the host sent {wheel['filename']} in pieces that do not add up")
            stream.write(data)
            digest.update(data)
            offset += len(data)
    if digest.hexdigest() != expected:
        raise PackageError(f"{wheel['filename']} arrived with another sha256 than the host's; not installed")
    return target


def _unpack(wheel_file: Path, staging: Path) -> None:
    """Unpack one wheel into the staging tree, with ``installer`` (RECORD, scripts, data)."""
    try:
        from installer import install as install_wheel
        from installer.destinations import SchemeDictionaryDestination
        from installer.sources import WheelFile
    except ImportError:
        raise PackageError(
            "this sandbox image has no `installer` package (it is older than %pip support);"
            " rebuild it with `kernelbridge image build`"
        ) from None
    schemes = {
        "purelib": str(staging / "site"),
        "platlib": str(staging / "site"),
        "headers": str(staging / "include"),
        "scripts": str(staging / "bin"),
        "data": str(staging / "data"),
    }
    destination = SchemeDictionaryDestination(schemes, interpreter=sys.executable, script_kind="posix")
    with WheelFile.open(wheel_file) as source:
        source.validate_record()
        install_wheel(source, destination, {"INSTALLER": b"kernelbridge\n"})


def _commit(staging: Path, base: Path, names: list[str]) -> list[str]:
    """Move the staged tree into place. Files of an earlier install of the same names in this
    session's directory are moved aside first (into the staging tree, which is removed after); a
    file another distribution owns fails the install. Every move is undone if one fails. Returns
    the names that replaced an earlier install."""
    moved: list[tuple[Path, Path]] = []
    try:
        replaced = _retire(base / "site", names, staging / "old", moved)
        for part in ("site", "bin", "include", "data"):
            source = staging / part
            if source.is_dir():
                _merge(source, base / part, moved)
    except BaseException:
        for destination, source in reversed(moved):
            with contextlib.suppress(OSError):
                source.parent.mkdir(parents=True, exist_ok=True)
                os.rename(destination, source)
        raise
    return replaced


def _merge(source: Path, destination: Path, moved: list[tuple[Path, Path]]) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        target = destination / entry.name
        if not target.exists() and not target.is_symlink():
            os.rename(entry, target)
            moved.append((target, entry))
        elif entry.is_dir() and target.is_dir() and not target.is_symlink():
            _merge(entry, target, moved)  # a namespace package shared by several distributions
        else:
            raise PackageError(f"{target.name} is already installed by another package; not replaced")


def _retire(site_path: Path, names: list[str], aside: Path, moved: list[tuple[Path, Path]]) -> list[str]:
    """Move the files of earlier installs of ``names`` (in this session's directory only, by their
    RECORD) to ``aside``; each move is listed in ``moved`` (as (where it went, where it was))."""
    wanted = {_normalize(name) for name in names}
    replaced: list[str] = []
    if not site_path.is_dir():
        return replaced
    top = site_path.resolve()
    for dist_info in sorted(site_path.glob("*.dist-info")):
        name = _normalize(dist_info.name[: -len(".dist-info")].rsplit("-", 1)[0])
        if name not in wanted:
            continue
        replaced.append(name)
        paths = []
        with contextlib.suppress(OSError):
            for line in (dist_info / "RECORD").read_text().splitlines():
                path = Path(os.path.abspath(site_path / line.split(",", 1)[0]))
                if path.is_relative_to(top) and path.is_file() and not path.is_relative_to(dist_info):
                    paths.append(path)
        for path in [*paths, dist_info]:
            target = aside / path.relative_to(top)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, target)
            moved.append((target, path))
    return replaced


def _shadow_notes(wheels: list[dict[str, Any]], before: dict[str, str], replaced: list[str]) -> list[str]:
    """What the user must know: a version that replaced one already imported needs a restart."""
    notes = []
    for wheel in wheels:
        name, old = str(wheel["name"]), before.get(str(wheel["name"]))
        if old is None or old == wheel["version"]:
            continue
        modules = _top_level(name)
        if any(module in sys.modules for module in modules):
            notes.append(
                f"Note: {name} {old} was already imported; restart the kernel to use {name}"
                f" {wheel['version']} (installed packages and /workspace files stay)."
            )
    return notes


def _top_level(name: str) -> list[str]:
    with contextlib.suppress(Exception):
        dist = importlib.metadata.distribution(name)
        text = dist.read_text("top_level.txt")
        if text:
            return [line.strip() for line in text.splitlines() if line.strip()]
    return [name.replace("-", "_")]


# -- list and show (no host needed) -----------------------------------------------------------------


def installed() -> list[dict[str, str]]:
    """Every importable distribution: name, version, and where (``session`` or ``image``)."""
    site_path = site_dir()
    ours = str(site_path.resolve()) if site_path is not None else "\0"
    rows: dict[str, dict[str, str]] = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            continue
        if not name or _normalize(name) in rows:
            continue
        location = str(Path(str(dist.locate_file(""))).resolve())
        rows[_normalize(name)] = {
            "name": name,
            "version": dist.version,
            "location": "session" if location.startswith(ours) else "image",
        }
    return sorted(rows.values(), key=lambda row: row["name"].lower())


def show(name: str) -> dict[str, str] | None:
    """pip show's fields for one distribution, or None."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    meta = dist.metadata
    requires = sorted(
        {
            re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0]
            for req in (dist.requires or [])
            if "extra ==" not in req.replace("extra==", "extra ==")  # pip show leaves extras out
        }
    )
    location = str(Path(str(dist.locate_file(""))).resolve())
    return {
        "Name": meta["Name"] or name,
        "Version": dist.version,
        "Summary": meta["Summary"] or "",
        "Home-page": meta["Home-page"] or "",
        "License": meta["License"] or "",
        "Location": location,
        "Requires": ", ".join(r for r in requires if r),
        "Installer": (dist.read_text("INSTALLER") or "").strip(),
    }
