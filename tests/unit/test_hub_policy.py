"""Operator policy: settings parsing and matching."""

from __future__ import annotations

import pytest

from kernelbridge.config import load_settings
from kernelbridge.errors import ConfigError
from kernelbridge.hub import Policy


def test_settings_parse_lists() -> None:
    s = load_settings(
        {
            "HOME": "/h",
            "KERNELBRIDGE_ALLOW_SERVERS": " time, git* ,",
            "KERNELBRIDGE_DENY_SERVERS": "github-prod",
            "KERNELBRIDGE_DENY_TOOLS": "github.delete_*, *.shell",
        }
    )
    assert s.allow_servers == ("time", "git*")
    assert s.deny_servers == ("github-prod",)
    assert s.deny_tools == ("github.delete_*", "*.shell")
    assert load_settings({"HOME": "/h"}).deny_tools == ()


def test_predecessor_fallback_name() -> None:
    assert load_settings({"HOME": "/h", "MCP_BRIDGE_DENY_SERVERS": "x"}).deny_servers == ("x",)


def test_deny_tools_needs_server_dot_tool() -> None:
    with pytest.raises(ConfigError, match=r"KERNELBRIDGE_DENY_TOOLS: 'shell' is not a server.tool pattern"):
        load_settings({"HOME": "/h", "KERNELBRIDGE_DENY_TOOLS": "shell"})


def test_servers() -> None:
    open_policy = Policy()
    assert open_policy.server_allowed("anything")
    policy = Policy(allow_servers=("time", "git*"), deny_servers=("github-prod",))
    assert policy.server_allowed("time") and policy.server_allowed("github")
    assert not policy.server_allowed("github-prod")  # deny wins over allow
    assert not policy.server_allowed("everything")  # not in the allow list
    assert not policy.server_allowed("Time")  # case-sensitive
    assert policy.why_denied("github-prod") == "KERNELBRIDGE_DENY_SERVERS"
    assert policy.why_denied("everything") == "KERNELBRIDGE_ALLOW_SERVERS"


def test_tools() -> None:
    policy = Policy(deny_servers=("off",), deny_tools=("github.delete_*", "*.shell", "my.server.drop"))
    assert not policy.tool_allowed("github", "delete_repo")
    assert policy.tool_allowed("github", "list_repos")
    assert not policy.tool_allowed("anything", "shell")
    assert policy.tool_allowed("anything", "shell_quote")
    assert not policy.tool_allowed("my.server", "drop")  # dots in a server name need no escaping
    assert not policy.tool_allowed("off", "echo")  # a denied server denies its tools
