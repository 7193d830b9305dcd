"""Saved tools ("skills"): ``save_tool(func)`` stores a function's source on the host; ``from mcp.skills
import name`` loads one into a fresh module. Nothing saved ever runs unless imported explicitly.

The host keeps the source under its state directory (docs/rpc.md, "Saved tools"); the sandbox only
sends and receives text. A loaded skill lives in the module ``mcp.skills.<name>``, compiled under the
file name ``<mcp.skills.name>`` with its source in ``linecache`` (tracebacks and ``inspect.getsource``
work), and sees ``mcp``, ``runtime``, ``mcp_servers``, ``save_tool`` and the ``mcp_<alias>`` proxies
granted at load time as globals. Imports are cached like any module; saving a new version from
this kernel drops the cached one, so the next import loads it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import keyword
import linecache
import re
import sys
import textwrap
import types
from collections.abc import Callable, Sequence
from typing import Any

from . import _transport
from ._errors import McpError, McpInvalidParams, McpUnknownTool
from ._registry import REGISTRY

SKILLS_PACKAGE = "mcp.skills"
_SAVE_TOOL_DECORATOR = re.compile(r"^@[ \t]*(?:(?:mcp|runtime)\.)?save_tool[ \t]*(?:#.*)?\n", re.MULTILINE)


def valid_skill_name(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) and name[0] != "_"


def save_tool(func: Callable[..., Any]) -> str:
    """Save ``func`` on the host so that later sessions can ``from mcp.skills import <name>`` it.

    Saves the function's source (``inspect.getsource``, dedented) and docstring under its name,
    replacing an earlier version. Works for functions defined in a cell. Put the imports a saved
    function needs inside it: only the function's own source is saved.

    Raises TypeError if ``func`` is not a plain named function with source (a lambda, a builtin,
    a closure over an enclosing function's variables), McpError if the host refuses.
    """
    __tracebackhide__ = True
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    if not inspect.isfunction(func):
        raise TypeError(f"save_tool() expects a function defined with def, not {type(func).__name__}")
    name = func.__name__
    if not valid_skill_name(name):
        raise TypeError(f"save_tool() needs a function with a public name, not {name!r} (define it with def)")
    if func.__code__.co_freevars:
        names = ", ".join(func.__code__.co_freevars)
        raise TypeError(
            f"save_tool() saves top-level functions only: {name}() uses variables of an enclosing"
            f" function ({names}) that a later session would not have"
        )
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise TypeError(f"save_tool() cannot find the source of {name}() ({exc})") from None
    # `@save_tool` above the def would make every later import of the skill save it again.
    source = _SAVE_TOOL_DECORATOR.sub("", source)
    description = inspect.getdoc(func) or ""
    result = _transport.request("save_tool", {"name": name, "source": source, "description": description})
    forget_loaded(name)
    replaced = isinstance(result, dict) and result.get("replaced") is True
    action = "replaced the earlier version of" if replaced else "saved"
    return f"{action} tool {name!r}; later sessions load it with: from mcp.skills import {name}"


def list_skills() -> list[dict[str, Any]]:
    """The saved tools: ``[{"name", "description", "saved_at"}]``."""
    __tracebackhide__ = True
    result = _transport.request("list_skills", {})
    skills = result.get("skills") if isinstance(result, dict) else None
    if not isinstance(skills, list):
        raise McpError("the host sent a malformed skill list")
    return [s for s in skills if isinstance(s, dict)]


def forget_loaded(name: str) -> None:
    """Drop a cached ``mcp.skills.<name>`` so that the next import fetches the saved version."""
    sys.modules.pop(f"{SKILLS_PACKAGE}.{name}", None)
    package = sys.modules.get(SKILLS_PACKAGE)
    if package is not None:
        package.__dict__.pop(name, None)


def skill_globals(package: types.ModuleType) -> dict[str, Any]:
    """The names a loaded skill sees besides its own: the sandbox API as bound at load time
    (``package`` is the ``mcp`` package, which hands itself to its SkillFinder)."""
    names: dict[str, Any] = {
        "mcp": package,
        "runtime": package.runtime,
        "mcp_servers": REGISTRY.servers,
        "save_tool": save_tool,
    }
    names.update({f"mcp_{proxy._kb_alias}": proxy for proxy in REGISTRY.servers.values()})
    return names


class SkillLoader(importlib.abc.Loader):
    """Executes a saved tool's source, fetched with ``load_skill``, in a fresh module."""

    def __init__(self, name: str, package: types.ModuleType) -> None:
        self.name = name
        self.package = package

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        __tracebackhide__ = True
        try:
            record = _transport.request("load_skill", {"name": self.name})
        except (McpUnknownTool, McpInvalidParams) as exc:
            raise ModuleNotFoundError(
                f"No saved tool named {self.name!r} ({exc}); runtime.list_skills() lists the saved tools",
                name=module.__name__,
            ) from None
        source = record.get("source") if isinstance(record, dict) else None
        if not isinstance(source, str):
            raise McpError(f"the host sent a malformed saved tool {self.name!r}")
        filename = f"<{module.__name__}>"
        # mtime None: linecache.checkcache() keeps entries without a file on disk.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        description = record.get("description")
        module.__dict__.update(skill_globals(self.package))
        module.__doc__ = description if isinstance(description, str) else None
        exec(compile(source, filename, "exec"), module.__dict__)


class SkillFinder(importlib.abc.MetaPathFinder):
    """Finds ``mcp.skills.<name>`` for any valid name; whether it exists is the host's answer.

    ``package`` is the ``mcp`` package whose API loaded skills see: the package installs the
    finder and passes itself (importing it from here would make an import cycle)."""

    def __init__(self, package: types.ModuleType) -> None:
        self.package = package

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix = SKILLS_PACKAGE + "."
        name = fullname[len(prefix) :] if fullname.startswith(prefix) else ""
        if not valid_skill_name(name):
            return None
        return importlib.machinery.ModuleSpec(
            fullname, SkillLoader(name, self.package), origin=f"saved tool {name!r}"
        )


def import_skill(name: str) -> Any:
    """``from mcp.skills import name``: the module's function ``name`` (or the module if it has none)."""
    __tracebackhide__ = True
    module = importlib.import_module(f"{SKILLS_PACKAGE}.{name}")
    value = getattr(module, name, module)
    package = sys.modules.get(SKILLS_PACKAGE)
    if package is not None:
        # The import system just set the package attribute to the module; the name means the function.
        setattr(package, name, value)
    return value
