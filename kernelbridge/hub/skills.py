"""Saved tools ("skills"): Python source that sandboxed code stored for later sessions.

A namespace's store is ``<namespace state dir>/skills/``: ``<name>.py`` (the source, byte for byte)
beside ``<name>.json`` (description, time saved), mode 0600 in a 0700 directory, at most
:data:`MAX_SKILLS`. The host **never executes or imports** a skill: it parses it once, to report a
syntax error at save time. The rpc methods use one namespace's store, the CLI every namespace's (an
HTTP token's tools as ``namespace/tool``). Nothing returned names a host path; every function
raises :class:`~kernelbridge.errors.SkillError` with a one-line reason.
"""

from __future__ import annotations

import ast
import json
import keyword
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from kernelbridge.calls.wire import MAX_DESCRIPTION_CHARS, MAX_SOURCE_BYTES
from kernelbridge.config import HTTP_DIR, namespace_state_dir
from kernelbridge.errors import ConfigError, SkillError

MAX_NAME_CHARS = 64
MAX_SKILLS = 1000
"""A runaway loop calling save_tool must not fill the disk with files."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class SkillInfo:
    name: str
    description: str
    saved_at: str
    """UTC, ISO 8601 (``2026-01-31T12:00:00Z``)."""
    namespace: str = ""
    """The HTTP token's namespace whose store holds it (``""``: the shared store)."""


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    source: str
    description: str
    saved_at: str


def skills_dir(state_dir: Path) -> Path:
    return state_dir / "skills"


def validate_skill_name(name: object) -> str:
    """``name`` if it can be a skill's name (a Python identifier that imports as a module)."""
    if (
        not isinstance(name, str)
        or len(name) > MAX_NAME_CHARS
        or not _NAME.fullmatch(name)
        or keyword.iskeyword(name)
        or name.startswith("__")
    ):
        shown = repr(name[:MAX_NAME_CHARS]) if isinstance(name, str) else type(name).__name__
        raise SkillError(
            f"invalid skill name {shown}: use a Python identifier of at most {MAX_NAME_CHARS} "
            "ASCII characters (not a keyword, not starting with '__')"
        )
    return name


def save_skill(state_dir: Path, name: str, source: str, description: str = "") -> bool:
    """Store a skill; returns whether it replaced one of the same name."""
    validate_skill_name(name)
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError:
        raise SkillError("skill source is not valid Unicode (lone surrogates)") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise SkillError(f"skill source is {len(data):,} bytes; the limit is {MAX_SOURCE_BYTES:,}")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillError(
            f"skill description is {len(description):,} characters; the limit is {MAX_DESCRIPTION_CHARS:,}"
        )
    try:
        ast.parse(source, filename=f"<skill {name}>")
    except SyntaxError as exc:
        raise SkillError(f"skill {name!r} does not parse: {exc.msg} (line {exc.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise SkillError(f"skill {name!r} does not parse: {type(exc).__name__}") from None
    directory = _private_dir(skills_dir(state_dir))
    replaced = (directory / f"{name}.py").exists()
    if not replaced and sum(1 for _ in directory.glob("*.py")) >= MAX_SKILLS:
        raise SkillError(f"{MAX_SKILLS} skills are saved already; remove some with `kernelbridge skills rm`")
    meta = {"description": description, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write_private(directory / f"{name}.py", data)
    _write_private(directory / f"{name}.json", json.dumps(meta, ensure_ascii=False).encode())
    return replaced


def list_skills(state_dir: Path) -> list[SkillInfo]:
    """Every saved skill, sorted by name."""
    directory = skills_dir(state_dir)
    try:
        paths = sorted(directory.glob("*.py"))
    except OSError:
        return []
    infos = []
    for path in paths[:MAX_SKILLS]:
        if not _NAME.fullmatch(path.stem):
            continue
        meta = _read_meta(directory, path.stem)
        infos.append(SkillInfo(path.stem, meta.get("description", ""), meta.get("saved_at", "")))
    return infos


def list_every_skill(state_dir: Path) -> list[SkillInfo]:
    """The operator's view: the shared store's skills (bare names), then each HTTP namespace's,
    named ``namespace/tool``, namespaces in name order."""
    infos = list_skills(state_dir)
    try:
        namespaces = sorted(p.name for p in (state_dir / HTTP_DIR).iterdir() if (p / "skills").is_dir())
    except OSError:
        namespaces = []
    for namespace in namespaces:
        try:
            store = namespace_state_dir(state_dir, namespace)
        except ConfigError:
            continue  # not a directory a bridge made
        for info in list_skills(store):
            infos.append(SkillInfo(f"{namespace}/{info.name}", info.description, info.saved_at, namespace))
    return infos


def locate(state_dir: Path, qualified: str) -> tuple[Path, str]:
    """The store (a namespace's state directory) and bare name of ``tool`` or ``namespace/tool``.
    Raises SkillError for a name that is neither."""
    namespace, sep, name = qualified.rpartition("/")
    if not sep:
        return state_dir, qualified
    try:
        if not namespace:
            raise ConfigError("no namespace before the '/'")
        return namespace_state_dir(state_dir, namespace), validate_skill_name(name)
    except ConfigError:
        raise SkillError(
            f"invalid skill name {qualified[:100]!r}: use NAME or NAMESPACE/NAME "
            "(see `kernelbridge skills list`)"
        ) from None


def read_skill(state_dir: Path, name: str) -> Skill:
    """One skill's source and metadata. Raises SkillError if the name is invalid or not saved."""
    validate_skill_name(name)
    directory = skills_dir(state_dir)
    try:
        data = (directory / f"{name}.py").read_bytes()[: MAX_SOURCE_BYTES + 1]
    except FileNotFoundError:
        raise SkillError(f"no skill named {name!r} is saved") from None
    except OSError as exc:
        raise SkillError(f"skill {name!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    meta = _read_meta(directory, name)
    source = data.decode("utf-8", errors="replace")
    return Skill(name, source, meta.get("description", ""), meta.get("saved_at", ""))


def remove_skill(state_dir: Path, name: str) -> bool:
    """Delete a skill; returns whether one existed."""
    validate_skill_name(name)
    directory = skills_dir(state_dir)
    existed = False
    for path in (directory / f"{name}.py", directory / f"{name}.json"):
        try:
            path.unlink()
            existed = existed or path.suffix == ".py"
        except FileNotFoundError:
            pass
    return existed


def _read_meta(directory: Path, name: str) -> dict[str, str]:
    try:
        meta = json.loads((directory / f"{name}.json").read_bytes()[:65536])
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    return {k: v for k, v in meta.items() if k in ("description", "saved_at") and isinstance(v, str)}


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)  # mkdir's mode is masked by the umask, and an existing dir keeps its own
    return path


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` atomically as a 0600 file (a reader never sees half a skill)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
