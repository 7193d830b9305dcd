"""A package's names imported when first used (PEP 562), not when the package is.

A package ``__init__`` that imports what it re-exports makes every one of its modules cost all of
them: ``kernelbridge sessions`` (a few JSON files read) paid 2 s for the MCP client SDK through
``kernelbridge.session``. Such a package lists its names as imports under ``if TYPE_CHECKING:``
(what readers, mypy and tests/structure_checks.py see) and ends with::

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

so that ``from kernelbridge.hub import load_catalog`` imports ``kernelbridge.hub.config`` and
nothing else of the hub. Also what a process never imports, and bulk imports run uncollected.
Standard library only, below every layer.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def lazy_exports(package: str, init_file: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose ``__init__`` is ``init_file``: each
    name it imports under ``if TYPE_CHECKING:`` comes from its module on first use, and is an
    ordinary attribute of the package from then on."""
    origins: dict[str, tuple[str, str]] = {}
    read: list[bool] = []

    def origin(name: str) -> tuple[str, str] | None:
        if not read:  # the package's source, parsed once: what mypy checks is what runs
            origins.update(typing_imports(Path(init_file).read_text(encoding="utf-8")))
            read.append(True)
        return origins.get(name)

    def __getattr__(name: str) -> object:
        found = origin(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = found
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        origin("")
        return sorted({*vars(sys.modules[package]), *origins})

    return __getattr__, __dir__


def typing_imports(source: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` for each ``from M import A [as N]`` directly under a
    top-level ``if TYPE_CHECKING:`` of ``source`` (absolute imports only)."""
    import ast  # only once a lazy name is first used

    found: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (
            isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        ):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
                for name in statement.names:
                    found[name.asname or name.name] = (statement.module, name.name)
    return found


NEVER_IMPORTED = ("rfc3987_syntax", "trio")
"""Optional modules that a library imports when they are installed and no kernelbridge process
uses. ``rfc3987_syntax`` (the lab extra brings it: jupyter-events asks for
``jsonschema[format-nongpl]``) builds ~35 Lark parsers as jsonschema (under nbformat and
jupyter-events) is imported: 1.8 s of CPU in each bridge, ``export``, ``replay`` and ``lab`` (and
1.2 s in a bridge's journal worker, ``notebook.export.run_niced``), for the
``iri`` format check that no notebook, MCP or Jupyter event schema uses, and that nothing here asks
a format checker for (python-jsonschema/jsonschema#1428). ``trio``: httpcore2 imports it, when it
is installed (selenium brings it), to tell whether it runs under trio; every kernelbridge process
runs anyio on asyncio, and the import is 0.1-0.15 s of each bridge's start."""


def skip_unused_imports() -> None:
    """Make :data:`NEVER_IMPORTED` unimportable in this process: their importers go without them,
    as when they are not installed. For the command line's own processes only: kernelbridge
    imported into someone's Jupyter server (the provisioner) must not change its imports."""
    for name in NEVER_IMPORTED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "not importable"


@contextmanager
def uncollected() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a bulk import, and what it made frozen after
    (``gc.freeze``: no later collection walks it). Importing the MCP SDK builds ~560 pydantic
    models: the collector ran ~250 times in a bridge's start, 0.1 of its 0.9 CPU-seconds, and
    freed a few hundred objects; modules and classes live as long as the process anyway. The cost:
    a cycle that was garbage when frozen is never freed (a few hundred objects, once). For the
    command line's own processes only, which own their heap: in a process that imported
    kernelbridge (a Jupyter server, a test) it would hide that process's objects from
    ``gc.get_referrers`` and from every later collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
