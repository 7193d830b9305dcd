"""Saved tools, loaded on request: ``from mcp.skills import <name>``.

Each import fetches the saved source from the host (``load_skill``) and executes it in a fresh module
``mcp.skills.<name>``; the name imported is that module's function of the same name. Nothing here
runs by itself. ``save_tool(func)`` saves one, ``runtime.list_skills()`` lists them.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from mcp._skills import import_skill, valid_skill_name

    if not valid_skill_name(name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return import_skill(name)
