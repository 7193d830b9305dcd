"""A small MCP server for edge cases, used by kernelbridge's tests as a host-side MCP peer.

Run it over stdio (the default) or streamable HTTP on 127.0.0.1::

    python tests/peers/edge_server.py                       # stdio
    python tests/peers/edge_server.py --http --port 8931    # http://127.0.0.1:8931/mcp

Options: ``--name NAME`` (the server's reported name, default ``edge``), ``--stderr-lines N``
(write N lines to stderr at start, to test that a host captures a chatty server's stderr).

Tools (every one is deterministic and needs no network):

=======================  ==========================================================================
``echo(text)``           returns ``text`` unchanged
``length(text)``         returns ``len(text)``: a big argument without a big result
``slow(seconds)``        sleeps (asynchronously, so calls overlap), then returns ``"slept <seconds>"``
``huge(n_bytes)``        returns a text of ``n_bytes`` ASCII characters (``"x"`` repeated)
``crash()``              the process exits with status 3 in the middle of the call (no answer comes)
``add_tool(name)``       registers a tool ``name`` (returning its own name) and announces
                         ``tools/list_changed`` on both protocol eras
``env(name)``            whether the environment variable ``name`` is set (never its value)
``fail()``               a tool error: the result has ``isError: true``
``pid()``                the server's process id (to kill it from a test)
``wait(key, seconds)``   like ``slow``, answering ``"<key> waited <seconds>"``; records the call's
                         fate in ``$EDGE_STATE_DIR/<key>`` (``started <pid>``, then ``done`` or
                         ``cancelled``), so a test sees from outside that the call reached the
                         server and whether the host cancelled it
``meet(group, count)``   answers ``"<group> met <count>"`` once ``count`` calls of ``group`` are in
                         flight together, a tool error if fewer ever were within ``seconds``
                         (default 30): calls that overlap meet, calls made one by one never do
=======================  ==========================================================================

The HTTP mode accepts request bodies up to 64 MiB so that 10 MB arguments pass.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

MAX_REQUEST_BODY = 64 * 1024 * 1024
"""Bytes of one HTTP request: 10 MB arguments (plus JSON escaping) must pass."""
MAX_HUGE = 64 * 1024 * 1024
"""Bound on ``huge``: a typo must not make the test machine allocate gigabytes."""


@dataclass
class Meeting:
    """The calls of one ``meet`` group in flight, and the event that lets them all go."""

    arrived: int = 0
    everyone: anyio.Event = field(default_factory=anyio.Event)


def build_server(name: str = "edge") -> MCPServer:
    app = MCPServer(name, instructions="Edge cases for kernelbridge tests.", log_level="WARNING")
    meetings: dict[str, Meeting] = {}

    @app.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @app.tool()
    def length(text: str) -> int:
        """Return the number of characters of the text."""
        return len(text)

    @app.tool()
    async def slow(seconds: float) -> str:
        """Sleep for some seconds, then answer."""
        await anyio.sleep(seconds)
        return f"slept {seconds:g}"

    @app.tool()
    def huge(n_bytes: int) -> str:
        """Return a text of n_bytes characters."""
        if not 0 <= n_bytes <= MAX_HUGE:
            raise ToolError(f"n_bytes must be between 0 and {MAX_HUGE}")
        return "x" * n_bytes

    @app.tool()
    def crash() -> str:
        """Exit the server process in the middle of the call."""
        sys.stderr.write("edge server: crashing on request\n")
        sys.stderr.flush()
        os._exit(3)

    @app.tool()
    async def add_tool(name: str, ctx: Context) -> str:
        """Register a new tool called name and announce that the tool list changed."""

        def added() -> str:
            return name

        app.add_tool(added, name=name, description=f"A tool added at run time ({name}).")
        await ctx.notify_tools_changed()  # 2026-07-28 clients: a subscriptions/listen event
        try:  # earlier clients: a notifications/tools/list_changed message
            await ctx.session.send_tool_list_changed()
        except Exception:  # the modern era has no such channel; the event above reaches it
            pass
        return f"added {name}"

    @app.tool()
    def env(name: str) -> bool:
        """Whether the environment variable is set (its value is never returned)."""
        return name in os.environ

    @app.tool()
    def fail() -> str:
        """Always fail with a tool error."""
        raise ToolError("this tool always fails")

    @app.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @app.tool()
    async def wait(key: str, seconds: float) -> str:
        """Sleep like slow, recording in $EDGE_STATE_DIR/<key> whether the call started, finished
        or was cancelled."""
        record(key, f"started {os.getpid()}")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            record(key, "cancelled")
            raise
        record(key, "done")
        return f"{key} waited {seconds:g}"

    @app.tool()
    async def meet(group: str, count: int, seconds: float = 30.0) -> str:
        """Answer once `count` calls of `group` are in flight together (a barrier); fail after
        `seconds` if fewer ever were."""
        meeting = meetings.setdefault(group, Meeting())
        meeting.arrived += 1
        try:
            if meeting.arrived >= count:
                meeting.everyone.set()
            with anyio.move_on_after(seconds):
                await meeting.everyone.wait()
                return f"{group} met {count}"
            raise ToolError(f"{group}: {meeting.arrived} of {count} calls met within {seconds:g} s")
        finally:
            if not meeting.everyone.is_set():
                meeting.arrived -= 1  # it left without meeting: no longer in flight

    return app


def record(key: str, state: str) -> None:
    """Write ``state`` to ``$EDGE_STATE_DIR/<key>`` (atomically: a reader never sees half a line)."""
    directory = os.environ.get("EDGE_STATE_DIR")
    if not directory or not key.isidentifier():
        return
    tmp = os.path.join(directory, f".{key}.tmp")
    with open(tmp, "w") as f:
        f.write(state)
    os.replace(tmp, os.path.join(directory, key))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--name", default="edge")
    parser.add_argument("--stderr-lines", type=int, default=1)
    args = parser.parse_args(argv)
    for i in range(args.stderr_lines):
        print(f"edge server {args.name}: stderr line {i + 1}", file=sys.stderr, flush=True)
    app = build_server(args.name)
    if args.http:
        anyio.run(
            lambda: app.run_streamable_http_async(
                host="127.0.0.1", port=args.port, max_request_body_size=MAX_REQUEST_BODY
            )
        )
    else:
        anyio.run(app.run_stdio_async)


if __name__ == "__main__":
    main()
