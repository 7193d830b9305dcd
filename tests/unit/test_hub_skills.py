"""The skills store: permissions, names, sizes, and no host path in any answer."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelbridge.config import load_settings
from kernelbridge.errors import RpcError, SkillError
from kernelbridge.hub import Hub, RpcCall, list_skills, read_skill, remove_skill, save_skill

SOURCE = 'def double(x):\n    """Twice x."""\n    return 2 * x\n'


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_save_list_read_remove(tmp_path: Path) -> None:
    assert list_skills(tmp_path) == []
    assert save_skill(tmp_path, "double", SOURCE, "Twice x.") is False
    assert save_skill(tmp_path, "double", SOURCE + "\n", "Twice x.") is True
    directory = tmp_path / "skills"
    assert mode(directory) == 0o700
    assert mode(directory / "double.py") == 0o600 and mode(directory / "double.json") == 0o600
    assert (directory / "double.py").read_text() == SOURCE + "\n"
    (info,) = list_skills(tmp_path)
    assert info.name == "double" and info.description == "Twice x." and info.saved_at.endswith("Z")
    skill = read_skill(tmp_path, "double")
    assert skill.source == SOURCE + "\n" and skill.description == "Twice x."
    assert remove_skill(tmp_path, "double") is True
    assert remove_skill(tmp_path, "double") is False
    assert list(directory.iterdir()) == []
    with pytest.raises(SkillError, match="no skill named 'double' is saved"):
        read_skill(tmp_path, "double")


def test_existing_directory_is_made_private(tmp_path: Path) -> None:
    (tmp_path / "skills").mkdir(mode=0o755)
    save_skill(tmp_path, "f", "f = 1\n")
    assert mode(tmp_path / "skills") == 0o700


@pytest.mark.parametrize(
    "name", ["", "1abc", "a-b", "a.b", "../x", "x/y", "class", "__init__", "é", "a" * 65, "a b"]
)
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(SkillError, match="invalid skill name"):
        save_skill(tmp_path, name, "x = 1\n")
    with pytest.raises(SkillError, match="invalid skill name"):
        read_skill(tmp_path, name)
    with pytest.raises(SkillError, match="invalid skill name"):
        remove_skill(tmp_path, name)
    assert not (tmp_path / "skills").exists() or list((tmp_path / "skills").iterdir()) == []


def test_size_and_syntax(tmp_path: Path) -> None:
    save_skill(tmp_path, "big", "x = 1\n" + "#" * (256 * 1024 - 7))
    with pytest.raises(SkillError, match="the limit is 262,144"):
        save_skill(tmp_path, "bigger", "#" * (256 * 1024 + 1))
    with pytest.raises(SkillError, match=r"skill 'bad' does not parse: .* \(line 1\)"):
        save_skill(tmp_path, "bad", "def f(:\n")
    with pytest.raises(SkillError, match="does not parse"):
        save_skill(tmp_path, "nul", "x = 1\0")


def test_source_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    save_skill(tmp_path, "sneaky", f"open({str(marker)!r}, 'w').write('x')\n")
    read_skill(tmp_path, "sneaky")
    list_skills(tmp_path)
    assert not marker.exists()


@pytest.mark.anyio
async def test_rpc_methods(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")}
    async with Hub(load_settings(env), env=env) as hub:

        async def call(method: str, **params: Any) -> Any:
            with anyio.fail_after(10):
                return await hub.dispatch(RpcCall("s", frozenset(), method, params))

        assert await call("save_tool", name="double", source=SOURCE, description="Twice x.") == {
            "name": "double",
            "replaced": False,
        }
        assert (await call("save_tool", name="double", source=SOURCE))["replaced"] is True
        listed = await call("list_skills")
        assert [s["name"] for s in listed["skills"]] == ["double"]
        assert set(listed["skills"][0]) == {"name", "description", "saved_at"}
        loaded = await call("load_skill", name="double")
        assert loaded == {"name": "double", "source": SOURCE, "description": ""}
        for method, params in [
            ("load_skill", {"name": "missing"}),
            ("save_tool", {"name": "a-b", "source": ""}),
        ]:
            with pytest.raises(RpcError) as info:
                await call(method, **params)
            assert info.value.kind == "invalid_params"
            assert str(tmp_path) not in info.value.message
        answers = json.dumps([listed, loaded])
        assert str(tmp_path) not in answers and "/skills" not in answers


@pytest.mark.anyio
async def test_each_namespace_has_a_store_of_its_own(tmp_path: Path) -> None:
    """Issue 13's first attack at the hub's seam: Alice's saved tool is invisible to Bob (and to
    the shared namespace), Bob cannot replace it by name, and Alice filling her cap leaves Bob's."""
    state = tmp_path / "state"
    env = {"HOME": str(tmp_path), "KERNELBRIDGE_STATE_DIR": str(state)}
    async with Hub(load_settings(env), env=env) as hub:

        async def call(namespace: str, method: str, **params: Any) -> Any:
            with anyio.fail_after(10):
                return await hub.dispatch(
                    RpcCall("default", frozenset(), method, params, namespace=namespace)
                )

        await call("alice", "save_tool", name="report", source="def report():\n    return 'alice'\n")
        assert [s["name"] for s in (await call("alice", "list_skills"))["skills"]] == ["report"]
        assert (await call("bob", "list_skills"))["skills"] == []
        assert (await call("", "list_skills"))["skills"] == []
        with pytest.raises(RpcError, match="no skill named 'report'"):
            await call("bob", "load_skill", name="report")
        replaced = await call("bob", "save_tool", name="report", source="def report():\n    return 'bob'\n")
        assert replaced["replaced"] is False  # Bob's own tool of that name, not a replacement of Alice's
        assert "'alice'" in (await call("alice", "load_skill", name="report"))["source"]
        assert "'bob'" in (await call("bob", "load_skill", name="report"))["source"]
    assert (state / "http" / "alice" / "skills" / "report.py").is_file()
    assert (state / "http" / "bob" / "skills" / "report.py").is_file()
    assert not (state / "skills").exists()


def test_the_cap_counts_per_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbridge.config import namespace_state_dir
    from kernelbridge.hub import skills

    monkeypatch.setattr(skills, "MAX_SKILLS", 3)
    alice, bob = namespace_state_dir(tmp_path, "alice"), namespace_state_dir(tmp_path, "bob")
    for n in range(3):
        save_skill(alice, f"f{n}", "x = 1\n")
    with pytest.raises(SkillError, match="3 skills are saved already"):
        save_skill(alice, "f3", "x = 1\n")
    save_skill(bob, "f0", "x = 1\n")  # Bob's allowance is untouched
    assert [i.name for i in skills.list_every_skill(tmp_path)] == [
        "alice/f0",
        "alice/f1",
        "alice/f2",
        "bob/f0",
    ]


@pytest.mark.parametrize("name", ["../x/f", "a/b/f", "Alice/f", "/f", "alice/", "alice/../f", ".x/f"])
def test_qualified_names_cannot_leave_the_tree(tmp_path: Path, name: str) -> None:
    from kernelbridge.hub.skills import locate

    with pytest.raises(SkillError, match="invalid skill name"):
        locate(tmp_path, name)
