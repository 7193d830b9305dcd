"""Every tool's bad arguments, through a real MCP client over stdio against ``kernelbridge serve``:
missing, ill-typed, unknown, huge or out of range, each answered with ``isError`` and one line
that names the argument and what it should be, never pydantic's report (its rejected value, its
documentation URL) and never the value sent back."""

from __future__ import annotations

from typing import Any

import pytest
from bridge_harness import text_of

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

HUGE = "x" * 2_000_000
BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("run_python", {}, "run_python needs `code` (a string)"),
    ("run_python", {"code": 5}, "run_python needs `code` as a string, not an integer"),
    ("run_python", {"code": None}, "run_python needs `code` as a string, not null"),
    ("run_python", {"code": [HUGE]}, "run_python needs `code` as a string, not a list holding a string"),
    ("run_python", {"code": "1", "timeout": "abc"}, "run_python needs `timeout` as an integer, not a string"),
    (
        "run_python",
        {"code": "1", "timeout": 2.5},
        "run_python needs `timeout` as an integer, not a number with a fraction",
    ),
    (
        "run_python",
        {"code": "1", "servers": "time"},
        "run_python needs `servers` as a list of strings, not a string",
    ),
    (
        "run_python",
        {"code": "1", "servers": ["time", 7]},
        "run_python needs `servers` as a list of strings, not a list holding a string and an integer",
    ),
    (
        "run_python",
        {"code": "1", "files": ["a.txt"]},
        "run_python needs `files` as an object of strings, not a list holding a string",
    ),
    (
        "run_python",
        {"code": 1, "session": 2, "timeout": [], "restore": {}},
        "run_python needs `code` as a string, not an integer; `session` as a string, not an integer;"
        " `timeout` as an integer, not an empty list (and 1 more)",
    ),
    (
        "run_python",
        {"code": "1", "sesion": "mine"},
        "run_python has no argument `sesion` (it takes: code, session, servers, timeout, files, restore)",
    ),
    ("run_python", {"code": "1", "timeout": -1}, "timeout must be between 1 and 600 seconds, got -1"),
    ("run_python", {"code": "1", "timeout": 0}, "timeout must be between 1 and 600 seconds, got 0"),
    ("run_python", {"code": "1", "timeout": 10**30}, "timeout must be between 1 and 600 seconds"),
    ("run_python", {"code": HUGE}, "code is 2,000,000 characters; the limit is 1,000,000"),
    ("run_python", {"code": "1", "session": "a/b"}, "invalid session name 'a/b': use 1-64 characters"),
    ("run_python", {"code": "1", "session": HUGE}, "invalid session name 'xxxxxxxx"),
    ("close_session", {}, "close_session needs `session` (a string)"),
    (
        "close_session",
        {"session": ["a"]},
        "close_session needs `session` as a string, not a list holding a string",
    ),
    ("close_session", {"session": HUGE}, "invalid session name 'xxxxxxxx"),
    ("export_notebook", {}, "export_notebook needs `session` (a string)"),
    ("export_notebook", {"session": 3}, "export_notebook needs `session` as a string, not an integer"),
    (
        "export_notebook",
        {"session": "s", "path": 7},
        "export_notebook needs `path` as a string, not an integer",
    ),
    ("export_notebook", {"session": HUGE}, "invalid session name 'xxxxxxxx"),
    ("export_notebook", {"session": "never-ran"}, "never-ran"),
    ("export_notebook", {"session": "s", "path": HUGE + ".ipynb"}, "path must be a relative file name"),
    ("export_notebook", {"session": "s", "path": "../x.ipynb"}, "may not contain '..'"),
    ("list_sessions", {"all": True}, "list_sessions has no argument `all` (it takes: no arguments)"),
]


async def test_every_bad_argument_is_refused_in_one_clear_line(connect: Any) -> None:
    async with connect() as client:
        answers = [
            (tool, args, expected, await client.call_tool(tool, args)) for tool, args, expected in BAD_CALLS
        ]
        still = await client.call_tool("list_sessions", {})
    for tool, args, expected, answer in answers:
        text = text_of(answer)
        shown = {k: (v if len(repr(v)) < 60 else "<huge>") for k, v in args.items()}
        assert answer.is_error, (tool, shown, text)
        assert expected in text, (tool, shown, text)
        assert "\n" not in text and len(text) < 400, (tool, shown, text[:500])
        assert "pydantic" not in text and "http" not in text and "Error executing" not in text, (tool, text)
    # Nothing of it cost the bridge anything: it answers, and no session was opened.
    assert not still.is_error and '"sessions": []' in text_of(still)
