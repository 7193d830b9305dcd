"""Aliases of servers and tools (docs/rpc.md, "Aliases")."""

from __future__ import annotations

import pytest

from kernelbridge.hub import alias, assign_aliases
from kernelbridge.hub.aliases import resolve


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("time", "time"),
        ("My-Server", "my_server"),
        ("github.com / tools", "github_com_tools"),
        ("a__b", "a__b"),
        ("2fa", "_2fa"),
        ("9", "_9"),
        ("---", "_"),
        ("import", "import_"),
        ("class", "class_"),
        ("Class", "class_"),
        ("None", "none"),  # lowercased first: no longer a keyword
        ("get-current-time", "get_current_time"),
        ("café", "caf_"),
    ],
)
def test_alias(name: str, expected: str) -> None:
    assert alias(name) == expected
    assert expected.isidentifier()


def test_collisions_in_order() -> None:
    assert assign_aliases(["a-b", "a_b", "A B", "a.b"]) == {
        "a-b": "a_b",
        "a_b": "a_b_2",
        "A B": "a_b_3",
        "a.b": "a_b_4",
    }


def test_collision_with_a_suffixed_name() -> None:
    aliases = assign_aliases(["x", "X", "x_2"])
    assert aliases == {"x": "x", "X": "x_2", "x_2": "x_2_2"}
    assert len(set(aliases.values())) == 3


def test_repeated_name_keeps_its_alias() -> None:
    assert assign_aliases(["a", "b", "a"]) == {"a": "a", "b": "b"}


def test_resolve_real_name_wins() -> None:
    aliases = assign_aliases(["a-b", "a_b"])
    assert resolve("a-b", aliases) == "a-b"
    assert resolve("a_b", aliases) == "a_b"  # the real name, though it is also a-b's alias
    assert resolve("a_b_2", aliases) == "a_b"
    assert resolve("zzz", aliases) is None
