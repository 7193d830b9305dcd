"""Settings parsing: env names, predecessor fallbacks, one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelbridge.config import Settings, load_settings
from kernelbridge.errors import ConfigError


def test_defaults() -> None:
    s = load_settings({"HOME": "/home/u"})
    assert s.state_dir == Path("/home/u/.local/state/kernelbridge")
    assert s.limits.memory == "512m" and s.limits.pids == 128 and s.warm_pool == 1
    assert s.output_limit == 20_000 and s.max_timeout == 600
    assert s.durable and not s.auto_restore  # a lost session offers restore= unless asked otherwise
    assert load_settings({"HOME": "/h", "KERNELBRIDGE_AUTO_RESTORE": "1"}).auto_restore


def test_xdg_state_home_and_overrides() -> None:
    s = load_settings(
        {
            "XDG_STATE_HOME": "/x",
            "KERNELBRIDGE_MEMORY": "1G",
            "KERNELBRIDGE_MAX_SESSIONS": "3",
            "KERNELBRIDGE_RUNTIME": "docker",
        }
    )
    assert s.state_dir == Path("/x/kernelbridge")
    assert s.limits.memory == "1g" and s.max_sessions == 3 and s.runtime == "docker"


def test_predecessor_names_are_fallbacks() -> None:
    s = load_settings({"MCP_BRIDGE_MAX_SESSIONS": "5", "MCP_BRIDGE_IMAGE": "img:1", "HOME": "/h"})
    assert s.max_sessions == 5 and s.image == "img:1"
    s = load_settings({"MCP_BRIDGE_MAX_SESSIONS": "5", "KERNELBRIDGE_MAX_SESSIONS": "2", "HOME": "/h"})
    assert s.max_sessions == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KERNELBRIDGE_MAX_SESSIONS": "many"}, "KERNELBRIDGE_MAX_SESSIONS='many' is not an integer"),
        ({"KERNELBRIDGE_MAX_SESSIONS": "0"}, "must be at least 1"),
        ({"KERNELBRIDGE_MEMORY": "lots"}, "is not a size"),
        ({"KERNELBRIDGE_RUNTIME": "lxc"}, "expected podman or docker"),
        ({"KERNELBRIDGE_DEFAULT_TIMEOUT": "900"}, "exceeds the maximum"),
    ],
)
def test_bad_values_are_one_line_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_settings({"HOME": "/h", **env})
    assert "\n" not in str(info.value)


def test_bad_values_are_kept_one_line_each_with_their_defaults_when_not_strict() -> None:
    # `serve` over stdio and `doctor` read settings this way (tests/integration/test_bad_settings.py).
    env = {
        "HOME": "/h",
        "KERNELBRIDGE_MAX_SESSIONS": "many",
        "MCP_BRIDGE_MEMORY": "lots",
        "KERNELBRIDGE_PACKAGES": "--index-url",
        "KERNELBRIDGE_DEFAULT_TIMEOUT": "900",
        "KERNELBRIDGE_MOUNTS": "/nowhere:/data",
        "KERNELBRIDGE_WARM_POOL": "2",
    }
    s = load_settings(env, strict=False)
    assert len(s.problems) == 5 and all("\n" not in line for line in s.problems), s.problems
    assert any(line.startswith("MCP_BRIDGE_MEMORY='lots'") for line in s.problems)
    assert s.max_sessions == 8 and s.limits.memory == "512m" and s.mounts == ()
    assert s.default_timeout == 30 and s.warm_pool == 2  # the good ones are read
    assert s.packages.policy == "none"  # a bad package policy installs nothing, not anything
    with pytest.raises(ConfigError, match=r"\(and 4 more bad settings\)$"):
        load_settings(env)
    assert load_settings({"HOME": "/h"}, strict=False).problems == ()


ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = sorted(
    {name for doc in [ROOT / "README.md", *ROOT.glob("docs/*.md")]
     for name in re.findall(r"KERNELBRIDGE_[A-Z][A-Z0-9_]*", doc.read_text(encoding="utf-8"))}
)  # fmt: skip
"""Every ``KERNELBRIDGE_*`` variable the documentation names."""


def test_every_variable_unset_or_blank_gives_the_records_defaults() -> None:
    # One default per setting: the record's field. An unset variable, or one set to blanks (an
    # MCP client's config with an empty "env" entry), leaves its setting there.
    assert len(DOCUMENTED) > 40 and "KERNELBRIDGE_DURABLE" in DOCUMENTED
    defaults = Settings(state_dir=Path("/h/.local/state/kernelbridge"))
    assert load_settings({"HOME": "/h"}) == defaults
    blank = {name: " " for name in [*DOCUMENTED, "KERNELBRIDGE_TIMEOUT", "DOCKER_HOST", "DOCKER_TLS_VERIFY"]}
    blank |= {name.replace("KERNELBRIDGE_", "MCP_BRIDGE_"): "" for name in blank}
    assert load_settings({"HOME": "/h", **blank}) == defaults
