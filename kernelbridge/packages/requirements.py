"""Requirement strings from the sandbox, checked before anything runs: parsing, policy. No I/O.

Everything here is untrusted input: ``%pip install`` lines typed (or generated) in the sandbox,
and the sandbox's own list of what it has installed. Each requirement is parsed with
``packaging.requirements.Requirement`` and kept only as what it says (a name, extras, a version
specifier), then written back in ``packaging``'s canonical form: so **no string from the sandbox
ever reaches pip's command line or a requirements file as it was sent**. Refused, one line each:

- options (``--index-url``, ``-e``, ``-r``, ``--extra-index-url``...): the host's pip decides where
  packages come from;
- URLs and paths (``name @ https://...``, ``./pkg``, ``file:...``, ``git+...``): only what the
  host's index serves can be installed, and only as a binary wheel;
- anything that does not parse, is longer than :data:`MAX_LINE` characters, or comes in more than
  :data:`MAX_REQUIREMENTS` at once.

Environment markers are evaluated here for the *sandbox's* interpreter
(:data:`kernelbridge.image.target.ENVIRONMENT`), not the host's; a requirement whose marker is
false is dropped, as pip would.

:class:`PackagePolicy` is ``KERNELBRIDGE_PACKAGES``: ``any``, ``none``, or allowed names (the
names the sandbox may ask for; their dependencies come with them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from kernelbridge.errors import RpcError
from kernelbridge.image.target import ENVIRONMENT

MAX_REQUIREMENTS = 64
"""Requirements in one install: a requirements file of a real project has a few dozen."""
MAX_LINE = 200
MAX_ENVIRONMENT = 2000
"""Distributions the sandbox may report as installed (the default image has about 60)."""
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
"""A project name as PEP 508 spells it: never starts with ``-``, so never an option."""
_URL_OR_PATH = re.compile(r"(^[./~\\])|(://)|(^[A-Za-z]:[\\/])|(^file:)|(^[a-z]+\+[a-z]+:)|[/\\]", re.I)
REFUSED_HOW = (
    "only package requirements such as `requests` or `polars>=1,<2` are accepted; options, URLs,"
    " paths and -e are refused (the host's pip decides where packages come from)"
)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One requirement the sandbox asked for, parsed and re-rendered by ``packaging``."""

    name: str
    """The PEP 503 normalized name (``scikit-learn``)."""
    text: str
    """The canonical requirement without marker, as the host writes it for pip (``numpy<2,>=1.26``)."""
    requirement: Requirement

    def allows(self, version: str) -> bool:
        """Whether ``version`` satisfies this requirement's specifier (pre-releases included)."""
        try:
            return self.requirement.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False


def refuse(message: str) -> RpcError:
    return RpcError("invalid_params", message)


def parse_requirement(line: object) -> Wanted | None:
    """One untrusted requirement line as a :class:`Wanted`; None when its marker is false for the
    sandbox. Raises RpcError ``invalid_params`` with one line saying why it is refused."""
    if not isinstance(line, str):
        raise refuse(f"a requirement is a string, not {type(line).__name__}")
    text = line.strip()
    shown = text[:80]
    if not text:
        raise refuse("an empty requirement")
    if len(text) > MAX_LINE:
        raise refuse(f"a requirement of {len(text):,} characters (the limit is {MAX_LINE})")
    if text.startswith("-"):
        raise refuse(f"{shown!r} is an option: {REFUSED_HOW}")
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        why = "a URL or a path" if _URL_OR_PATH.search(text) else "not a package requirement"
        raise refuse(f"{shown!r} is {why}: {REFUSED_HOW}") from None
    if requirement.url is not None:
        raise refuse(f"{shown!r} names a URL: {REFUSED_HOW}")
    if not _NAME.match(requirement.name):
        raise refuse(f"{shown!r} is not a package name: {REFUSED_HOW}")
    if requirement.marker is not None:
        try:
            if not requirement.marker.evaluate(dict(ENVIRONMENT)):
                return None
        except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            raise refuse(f"{shown!r}: its environment marker cannot be evaluated") from None
        requirement.marker = None
    return Wanted(canonicalize_name(requirement.name), str(requirement), requirement)


def parse_requirements(lines: object) -> list[Wanted]:
    """Every requirement of one install, duplicates by name refused. Raises RpcError."""
    if not isinstance(lines, list) or not lines:
        raise refuse("requirements must be a non-empty list of strings, e.g. ['requests']")
    if len(lines) > MAX_REQUIREMENTS:
        raise refuse(f"{len(lines)} requirements at once; the limit is {MAX_REQUIREMENTS}")
    wanted: dict[str, Wanted] = {}
    for line in lines:
        item = parse_requirement(line)
        if item is None:
            continue
        if item.name in wanted:
            raise refuse(f"{item.name} is named twice; give it once, with every specifier it needs")
        wanted[item.name] = item
    return list(wanted.values())


def parse_environment(items: object) -> dict[str, str]:
    """The sandbox's installed distributions, ``{normalized name: version}``, from its
    ``["name==version", ...]``. Untrusted but harmless (it only constrains the sandbox's own
    resolution); each item must be a plain name and a valid version, else RpcError."""
    if not isinstance(items, list):
        raise refuse("environment must be a list of 'name==version' strings")
    if len(items) > MAX_ENVIRONMENT:
        raise refuse(f"an environment of {len(items)} distributions; the limit is {MAX_ENVIRONMENT}")
    found: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str) or item.count("==") != 1 or len(item) > MAX_LINE:
            raise refuse(f"{str(item)[:80]!r} is not 'name==version'")
        name, version = item.split("==")
        if not _NAME.match(name):
            raise refuse(f"{name[:80]!r} is not a distribution name")
        try:
            found[canonicalize_name(name)] = str(Version(version))
        except InvalidVersion:
            raise refuse(f"{item[:80]!r}: {version[:40]!r} is not a version") from None
    return found


@dataclass(frozen=True, slots=True)
class PackagePolicy:
    """``KERNELBRIDGE_PACKAGES``: which requirement names the sandbox may ask the host for."""

    mode: str = "any"
    """``any`` (what the host's index serves), ``none`` (installing is off), ``names``."""
    names: frozenset[str] = frozenset()
    """Normalized names allowed when ``mode`` is ``names``."""

    @classmethod
    def parse(cls, raw: str) -> PackagePolicy:
        """``any``, ``none``, or names separated by commas or spaces. Raises ValueError."""
        value = raw.strip()
        if value.lower() in ("", "any"):
            return cls("any")
        if value.lower() == "none":
            return cls("none")
        names = [item for item in re.split(r"[\s,]+", value) if item]
        bad = [item for item in names if not _NAME.match(item)]
        if bad:
            raise ValueError(f"{bad[0][:80]!r} is not a package name (expected any, none, or names)")
        return cls("names", frozenset(canonicalize_name(item) for item in names))

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def describe(self) -> str:
        """One phrase for the manual and messages."""
        if self.mode == "any":
            return "any package the host's index serves as a wheel"
        if self.mode == "none":
            return "none (installing packages is turned off)"
        return "only " + ", ".join(sorted(self.names)) + " (and what they depend on)"

    def check(self, wanted: list[Wanted]) -> None:
        """Raise RpcError ``denied`` unless the policy allows every requirement."""
        if self.mode == "none":
            raise RpcError(
                "denied",
                "installing packages is turned off on this host (KERNELBRIDGE_PACKAGES=none);"
                " use what the sandbox image has (`%pip list`)",
            )
        if self.mode == "names":
            refused = [item.name for item in wanted if item.name not in self.names]
            if refused:
                allowed = ", ".join(sorted(self.names))
                raise RpcError(
                    "denied",
                    f"{', '.join(refused)} {'is' if len(refused) == 1 else 'are'} not allowed on this"
                    f" host (KERNELBRIDGE_PACKAGES allows {allowed})",
                )
