"""The capabilities manual: what a model reads from ``kernelbridge://capabilities``.

A model reads all of it, so it stays short: the sandbox in a few lines, how host MCP servers are
granted and called, then the servers this bridge offers (name, alias, description) and the config
problems the user should fix. Nothing here may name a server's command, arguments, environment,
URL or headers: :class:`ServerLine` carries only what is safe to show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_LISTED_SERVERS = 50
"""A host with more servers than this gets a count and ``runtime.discovered_servers()``."""
MAX_DESCRIPTION_CHARS = 160
MAX_PROBLEMS = 10

SANDBOX = """\
# kernelbridge sandbox

`run_python` runs code in a persistent IPython kernel inside a locked-down container.

- State persists per `session` (default "default"): variables, imports, functions and files
  in /workspace (writable) and /tmp. Sessions are isolated from each other.
- Top-level `await` works. The last expression's value is returned, like a notebook cell.
- No network. `input()` is not available. (What limits apply here: "This host", below.)
- `timeout` (seconds) interrupts the cell; if it does not stop, the kernel restarts and the
  result says `state: lost`. Output is truncated (head and tail kept) past a limit.
- `IPython.display.display(Image(...))` / matplotlib figures come back as images.
- Tools: list_sessions, close_session (frees the sandbox), export_notebook (a session's .ipynb
  written to path=, or where it is: the notebook is never returned into your context).
- Each session is also a notebook resource: kernelbridge://sessions/{session}/notebook
- Files in: `run_python(files={"data.csv": "a,b\\n1,2"})` places files in /workspace before the
  code runs (code may then be empty); a value starting with `base64:` is binary.
- Files out (while the session lives): kernelbridge://sessions/{session}/files (listing),
  .../files/{path} (text), .../blobs/{path} (binary).
- `run_python(restore="kernelbridge://sessions/{old}/notebook")` (or a .ipynb name in the
  exports directory) rebuilds a new session by re-running that notebook's cells; the result
  reports each cell as same / different / error / skipped.
- Large images arrive downscaled, with a resource link to the full-size original.
- Long jobs (minutes to hours): if your client can, call `run_python` as an MCP task (a
  task-augmented call); you get a task id at once, `timeout` defaults to the task maximum,
  and `tasks/get` shows elapsed time and the latest output line; `tasks/result` gives the
  ordinary result, `tasks/cancel` interrupts the cell (state kept). Other calls to that session
  queue behind the task and say so; use another session meanwhile. `list_sessions` shows each
  running cell's seconds and latest output.
"""

HOST_MCP = """\
## Host MCP servers (the user's own tools, called from code)

The user's MCP servers run on the host; sandboxed code calls them, so results can stay in
variables and be filtered in Python instead of passing through this conversation.

- Grant servers to a session: `run_python(code, servers=["name"])`. Grants last for the session.
- Call: `await mcp_<alias>.<tool>(arg=...)` (keyword arguments), or `mcp_<alias>.<tool>.sync(...)`
  in plain code; also `mcp_servers["name"]`, `from mcp.servers.<alias> import <tool>` and
  `await runtime.call_tool(server, tool, {...})`. Results are dicts
  `{"content", "structuredContent", "isError"}`; a tool's own error sets `isError`.
- Find tools (no grant needed): `runtime.search_tool_docs_sync("words")` (best first),
  `runtime.query_tool_docs_sync(server, tool, detail="full")`, `runtime.discovered_servers(detailed=True)`,
  `help(mcp_<alias>.<tool>)`.
- Failures raise `mcp.McpError` subclasses, e.g. `Server '<name>' is not available` (not granted).
- `save_tool(func)` keeps a function for later sessions (`from mcp.skills import <name>`).
"""


@dataclass(frozen=True, slots=True)
class ServerLine:
    """What the manual shows of one configured server."""

    name: str
    alias: str
    description: str


def render_manual(servers: Sequence[ServerLine] = (), problems: Sequence[str] = ()) -> str:
    """The manual for a bridge offering ``servers`` (after the operator's policy), with the
    config ``problems`` the hub found (one line each, as :meth:`Hub.problems` gives them)."""
    parts = [SANDBOX, HOST_MCP]
    if servers:
        lines = [f"Servers configured ({len(servers)}):"]
        for server in servers[:MAX_LISTED_SERVERS]:
            alias = f" as `mcp_{server.alias}`" if server.alias else ""
            description = " ".join(server.description.split())
            if len(description) > MAX_DESCRIPTION_CHARS:
                description = description[: MAX_DESCRIPTION_CHARS - 3] + "..."
            lines.append(f"- `{server.name}`{alias}" + (f": {description}" if description else ""))
        if len(servers) > MAX_LISTED_SERVERS:
            lines.append(f"- ... and {len(servers) - MAX_LISTED_SERVERS} more: runtime.discovered_servers()")
        parts.append("\n".join(lines) + "\n")
    else:
        parts.append(
            "No host MCP servers are configured. The user adds them in an MCP client's config\n"
            "(Claude Code, Claude Desktop, Cursor, VS Code), in ~/MCPs/*.json or with\n"
            "`kernelbridge serve --servers-config FILE`; `kernelbridge servers` lists what is found.\n"
        )
    if problems:
        lines = ["Config problems (entries skipped; the user can fix them):"]
        lines += [f"- {problem}" for problem in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"- ... and {len(problems) - MAX_PROBLEMS} more (see the bridge's log)")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def packages_section(
    installed: Sequence[str],
    policy: str,
    allowed: Sequence[str],
    max_bytes: int,
    max_installs: int,
    mounts: Sequence[str],
) -> str:
    """What the sandbox has and how more gets in: the image's packages (``name==version``), the
    ``%pip install`` policy and caps, and the read-only host directories (their sandbox paths only:
    the host's paths are not the model's business)."""
    lines = ["## Packages and data", ""]
    if installed:
        lines.append(f"- Python packages in the sandbox image: {', '.join(installed)}.")
    if policy == "none":
        lines.append("- Installing more packages is turned off on this host.")
    else:
        which = (
            "only " + ", ".join(allowed) + " (with their dependencies)"
            if policy == "names"
            else "any package"
        )
        lines.append(
            f"- More: `%pip install NAME` ({which}; also `!pip install`, `%pip install -r FILE`):"
            " the host's pip fetches binary wheels for the sandbox (which itself has no network) and"
            " they import in the next line, no restart. A package without a wheel (source only) cannot"
            f" come this way. Per session at most {max_bytes / 2**20:.0f} MiB installed and"
            f" {max_installs} installs; `%pip list`, `%pip show NAME`."
        )
    if mounts:
        lines.append(
            "- Data from the user's machine, read-only: "
            + ", ".join(f"`{target}`" for target in mounts)
            + "."
        )
    return "\n".join(lines) + "\n"
