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
