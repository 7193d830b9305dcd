"""Requirement strings from the sandbox, checked before anything runs: parsing, policy. No I/O.

Everything here is untrusted: ``%pip install`` lines, the sandbox's list of what it has installed,
the wheels a notebook says it installed. pip *interprets* what it is given (``${VAR}`` in
requirements files, option lines, anything that looks like a file name or URL), so each
requirement is parsed by ``packaging`` and rendered again from what it parsed (:func:`render`),
and the result must match :data:`_RENDERED`. Refused, one line each quoting the sandbox's text:
options, URLs and paths, ``===`` with anything but a normalized version, what does not parse, a
line over :data:`MAX_LINE` characters, more than :data:`MAX_REQUIREMENTS` at once. Environment
markers are evaluated for the *sandbox's* interpreter (:data:`kernelbridge.image.target.ENVIRONMENT`)
and never reach pip. :class:`PackagePolicy` is ``KERNELBRIDGE_PACKAGES``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from kernelbridge.errors import RpcError
from kernelbridge.image.target import ENVIRONMENT

MAX_REQUIREMENTS = 64
"""Requirements in one install: a requirements file of a real project has a few dozen."""
MAX_LINE = 200
MAX_SHOWN = 80
"""Characters of the sandbox's own text quoted back in a message."""
MAX_ENVIRONMENT = 2000
"""Distributions the sandbox may report as installed (the default image has about 60)."""
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
"""A project name as PEP 508 spells it: never starts with ``-``, so never an option."""
_URL_OR_PATH = re.compile(r"(^[./~\\])|(://)|(^[A-Za-z]:[\\/])|(^file:)|(^[a-z]+\+[a-z]+:)|[/\\]", re.I)
_WORD = r"[a-z0-9]+(?:-[a-z0-9]+)*"
_CLAUSE = r"(?:===|==|!=|<=|>=|~=|<|>)[0-9a-z.!+]+(?:\.\*)?"
_RENDERED = re.compile(rf"{_WORD}(?:\[{_WORD}(?:,{_WORD})*\])?(?:{_CLAUSE}(?:,{_CLAUSE})*)?")
"""Every line the host hands pip: a normalized name, extras, clauses of normalized versions."""
_ARCHIVE_END = re.compile(r"\.(?:whl|zip|tar|tgz|tbz|txz|tlz|gz|bz2|xz|lz|lzma)$")
"""pip reads a requirement ending like an archive (``x==1+local.zip``) as a file to install."""
REFUSED_HOW = (
    "only package requirements such as `requests` or `polars>=1,<2` are accepted; options, URLs,"
    " paths and -e are refused (the host's pip decides where packages come from)"
)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One requirement the sandbox asked for, parsed by ``packaging`` and rendered again."""

    name: str
    """The PEP 503 normalized name (``scikit-learn``)."""
    text: str
    """The requirement as the host renders it for pip, without marker (``numpy<2,>=1.26``)."""
    specifier: SpecifierSet
    shown: str
    """The sandbox's own text (stripped, capped): what messages quote, never what pip made of it."""

    def allows(self, version: str) -> bool:
        """Whether ``version`` satisfies this requirement's specifier (pre-releases included)."""
        try:
            return self.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False


def refuse(message: str) -> RpcError:
    return RpcError("invalid_params", message)


def is_rendered(line: str) -> bool:
    """Whether ``line`` is in the form the host renders for pip (:data:`_RENDERED`, and not ending
    like an archive): the one check every line passed to pip goes through."""
    return _RENDERED.fullmatch(line) is not None and _ARCHIVE_END.search(line) is None


def render(requirement: Requirement, shown: str) -> str:
    """``requirement`` (without its marker) rebuilt from what ``packaging`` parsed: normalized name
    and extras, each clause an operator and a normalized version. Raises RpcError."""
    extras = sorted(canonicalize_name(extra) for extra in requirement.extras)
    clauses = sorted(_clause(spec, shown) for spec in requirement.specifier)
    text = canonicalize_name(requirement.name) + (f"[{','.join(extras)}]" if extras else "")
    text += ",".join(clauses)
    if not is_rendered(text):
        raise refuse(f"{shown!r} cannot be passed on safely: {REFUSED_HOW}")
    return text


def _clause(spec: Specifier, shown: str) -> str:
    operator, version = spec.operator, spec.version
    if operator == "===":
        # Arbitrary equality compares strings, so it takes any text (`===${HOME}` would reach pip,
        # which expands it); only a version already in normalized form means the same rendered.
        if not _normalized(version):
            raise refuse(
                f"{shown!r}: arbitrary equality (===) is accepted only with a normalized version;"
                " use ==VERSION"
            )
        return operator + version
    wildcard = version.endswith(".*")
    base = version[:-2] if wildcard else version
    try:
        normal = str(Version(base))
    except InvalidVersion:
        raise refuse(f"{shown!r}: {version[:40]!r} is not a version") from None
    return operator + normal + (".*" if wildcard else "")


def _normalized(version: str) -> bool:
    try:
        return str(Version(version)) == version
    except InvalidVersion:
        return False


def render_pin(name: object, version: object) -> str:
    """``name==version`` for pip from an untrusted name and version (the sandbox's installed
    distributions, a notebook's record of wheels). Raises RpcError unless both are plain."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise refuse(f"{str(name)[:MAX_SHOWN]!r} is not a distribution name")
    try:
        text = f"{canonicalize_name(name)}=={Version(str(version))}"
    except InvalidVersion:
        raise refuse(f"{name}: {str(version)[:40]!r} is not a version") from None
    if not is_rendered(text):
        raise refuse(f"{name}=={str(version)[:40]} cannot be passed on safely")
    return text


def parse_requirement(line: object) -> Wanted | None:
    """One untrusted requirement line as a :class:`Wanted`; None when its marker is false for the
    sandbox. Raises RpcError ``invalid_params`` with one line saying why it is refused."""
    if not isinstance(line, str):
        raise refuse(f"a requirement is a string, not {type(line).__name__}")
    text = line.strip()
    shown = text[:MAX_SHOWN]
    if not text:
        raise refuse("an empty requirement")
    if len(text) > MAX_LINE:
        raise refuse(f"a requirement of {len(text):,} characters (the limit is {MAX_LINE})")
    if text.startswith("-"):
        raise refuse(f"{shown!r} is an option: {REFUSED_HOW}")
    if any(ch in text for ch in "\n\r\0"):
        raise refuse(f"{shown!r} holds a line break: one requirement per item")
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
    rendered = render(requirement, shown)
    return Wanted(canonicalize_name(requirement.name), rendered, requirement.specifier, shown)


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
    """The sandbox's installed distributions, ``{normalized name: normalized version}``, from its
    ``["name==version", ...]``. Untrusted: they become the constraints pip resolves with, so each
    must render as a plain pin (:func:`render_pin`), else RpcError."""
    if not isinstance(items, list):
        raise refuse("environment must be a list of 'name==version' strings")
    if len(items) > MAX_ENVIRONMENT:
        raise refuse(f"an environment of {len(items)} distributions; the limit is {MAX_ENVIRONMENT}")
    found: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str) or item.count("==") != 1 or len(item) > MAX_LINE:
            raise refuse(f"{str(item)[:MAX_SHOWN]!r} is not 'name==version'")
        name, version = item.split("==")
        pin = render_pin(name, version)
        found[canonicalize_name(name)] = pin.split("==", 1)[1]
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
