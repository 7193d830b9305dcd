"""What a Jupyter client may tell its sandbox: display settings by an allow-list, checked, and who
the person is (jupyter_client's placeholder username names nobody)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from kernelbridge.config import Settings
from kernelbridge.jupyter.client_env import DISPLAY_VARIABLES, display_env, real_username
from kernelbridge.jupyter.launch import launch_for, spec_of
from kernelbridge.runtime import ContainerSpec


def test_only_allowed_display_settings_with_sane_values_cross() -> None:
    host = {
        "COLUMNS": "132",
        "LINES": "40",
        "LANG": "de_DE.UTF-8",
        "TERM": "xterm-256color",
        "NO_COLOR": "1",
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "PATH": "/usr/bin",
        "HOME": "/root",
        "PAGER": "less",
        "LC_ALL": "C.UTF-8\nEVIL=1",
        "COLORTERM": "x" * 1000,
    }
    assert dict(display_env(host)) == {
        "COLUMNS": "132",
        "LINES": "40",
        "LANG": "de_DE.UTF-8",
        "TERM": "xterm-256color",
        "NO_COLOR": "1",
    }
    assert {"PAGER", "EDITOR", "MPLBACKEND", "TZ", "PATH"}.isdisjoint(DISPLAY_VARIABLES)


def test_values_that_try_to_smuggle_something_are_left_out_whole(  # issue 23
) -> None:
    hostile = {
        "TERM": "xterm\n",  # a trailing newline (re's `$` lets it through)
        "LANG": "C.UTF-8\n",
        "LINES": "40\n",
        "FORCE_COLOR": "1\n",
        "COLORTERM": "\x1b]0;owned\x07",  # an escape sequence (a terminal title)
        "LC_ALL": "../../etc/passwd",  # a path
        "LC_CTYPE": "en_US.UTF-8\x00X=1",
        "LC_MESSAGES": "sk-" + "a" * 48,  # a token shaped like a locale's worth of characters
        "LANGUAGE": ":".join(["en"] * 50),
        "COLUMNS": "99999",  # past any terminal
        "NO_COLOR": "",
        "CLICOLOR": "1" * 10**6,  # huge
        "LC_ALL_EXTRA": "C",  # names that look allowed
        "TERM ": "xterm",
        "TERMINFO": "/tmp/evil",
        "term": "xterm",
    }
    assert display_env(hostile) == ()
    fine = {"LANG": "de_DE.UTF-8@euro", "LANGUAGE": "de_DE:de:en", "LC_TIME": "C", "LC_CTYPE": "es_419.UTF-8",
            "TERM": "screen.xterm-256color", "COLORTERM": "truecolor", "COLUMNS": "10000"}  # fmt: skip
    assert dict(display_env(fine)) == fine


def test_the_terminal_gives_the_size_when_the_environment_does_not() -> None:
    assert dict(display_env({}, terminal=(90, 30))) == {"COLUMNS": "90", "LINES": "30"}
    assert dict(display_env({"COLUMNS": "50"}, terminal=(90, 30))) == {"COLUMNS": "50", "LINES": "30"}
    assert display_env({"COLUMNS": "0", "LINES": "-3"}, terminal=(0, 10**9)) == ()


def test_the_launch_carries_the_display_settings_and_checks_them_again() -> None:
    settings = Settings(state_dir=Path("/tmp/unused"))
    spec = ContainerSpec(image="i", name="n", session="s", owner_pid=1, env=(("COLUMNS", "80"),))
    launch = launch_for(connection_file="/c.json", spec=spec, agent_hash=None, settings=settings)
    assert spec_of(launch, settings).env == (("COLUMNS", "80"),)
    launch.container["env"] = [["COLUMNS", "80"], ["SECRET", "x"], ["LANG", "a b"]]
    assert spec_of(launch, settings).env == (("COLUMNS", "80"),)


def test_a_username_that_names_nobody_is_the_os_user() -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    assert real_username("username") == me and real_username("") == me and real_username("a\x1bb") == me
    assert real_username("alice") == "alice"
