"""Settings parsing: env names, predecessor fallbacks, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbridge.config import load_settings
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
