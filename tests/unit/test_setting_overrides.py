"""Every setting the suite changes from its default is listed with its reason
(``tests/setting_overrides.py``).

The product as shipped is every setting at its default; a test may change one only when that
setting is what it tests, or is an input the feature needs (which servers, which tokens, where the
state lives). This test finds each change in the suite's source (an AST walk: a ``KERNELBRIDGE_*``
or ``MCP_BRIDGE_*`` name as a string or a keyword, a ``Settings(...)`` or ``replace(settings,
...)`` field) and fails for one that is not listed, and for a listed one that is gone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from setting_overrides import INPUTS, OVERRIDES, WHOLE_FILES

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SETTING = re.compile(r"^(KERNELBRIDGE|MCP_BRIDGE)_[A-Z0-9_]+$")


def overrides_in(source: str) -> set[str]:
    """The settings a test module's source sets: variable names, and ``Settings`` fields."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SETTING.match(node.value):
            found.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg and SETTING.match(node.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Call) and _settings_call(node):
            found.update(f"Settings.{kw.arg}" for kw in node.keywords if kw.arg and kw.arg != "state_dir")
    return found


def _settings_call(node: ast.Call) -> bool:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name == "Settings":
        return True
    # dataclasses.replace(settings, field=...): the settings of a registry changed by a test
    return name == "replace" and bool(node.args) and "settings" in ast.unparse(node.args[0]).lower()


def suite_overrides() -> set[tuple[str, str]]:
    pairs = set()
    for path in sorted(TESTS.rglob("*.py")):
        relative = str(path.relative_to(REPO))
        if relative in WHOLE_FILES or path.name == "setting_overrides.py":
            continue
        pairs.update((relative, name) for name in overrides_in(path.read_text(encoding="utf-8")))
    return pairs


def test_every_override_in_the_suite_says_why() -> None:
    found = suite_overrides()
    unlisted = sorted(
        f"{path}: {name}" for path, name in found if name not in INPUTS and (path, name) not in OVERRIDES
    )
    assert not unlisted, (
        "settings changed from their default without a reason in tests/setting_overrides.py "
        "(change a default only when the setting is what the test is about):\n" + "\n".join(unlisted)
    )


def test_no_reason_is_left_for_an_override_that_is_gone() -> None:
    found = suite_overrides()
    stale = sorted(f"{path}: {name}" for path, name in OVERRIDES if (path, name) not in found)
    assert not stale, "listed in tests/setting_overrides.py but no longer in the test:\n" + "\n".join(stale)
    missing = sorted(path for path in WHOLE_FILES if not (REPO / path).is_file())
    assert not missing, missing


def test_every_reason_is_a_sentence() -> None:
    reasons = {**INPUTS, **WHOLE_FILES, **{f"{p}: {n}": why for (p, n), why in OVERRIDES.items()}}
    short = [what for what, why in reasons.items() if len(why.split()) < 3]
    assert not short, short


def test_an_unlisted_override_is_found() -> None:
    source = (
        'env = {"KERNELBRIDGE_WARM_POOL": "0"}\nopen_bridge(state, KERNELBRIDGE_DURABLE="0")\n'
        "Settings(state_dir=tmp, max_sessions=3)\nreplace(settings, idle_timeout=1)\n"
    )
    assert overrides_in(source) == {
        "KERNELBRIDGE_WARM_POOL",
        "KERNELBRIDGE_DURABLE",
        "Settings.max_sessions",
        "Settings.idle_timeout",
    }
