"""The MCP face of kernelbridge: four tools, two resources, and the process lifecycle.

- :mod:`~kernelbridge.server.app`: ``build_server`` (tools, resources, the lifespan that owns the
  runtime, the hub and the session registry) and ``serve``;
- :mod:`~kernelbridge.server.start`: that lifespan run as a task, so that ``initialize`` is
  answered at once and the requests that need the bridge wait for it;
- :mod:`~kernelbridge.server.render`: a cell's result as an MCP tool result, the one place
  outcomes (the session's and :mod:`~kernelbridge.server.notes`) become prose;
- :mod:`~kernelbridge.server.manual`: the capabilities manual for the model;
- :mod:`~kernelbridge.server.schema`: compact tool schemas;
- :mod:`~kernelbridge.server.exports`: notebook exports a model may ask for;
- :mod:`~kernelbridge.server.stdio`: stdio serving that signals can interrupt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelbridge.lazy import lazy_exports

if TYPE_CHECKING:
    from kernelbridge.server.app import BridgeContext, build_server, serve
    from kernelbridge.server.render import render_text, to_tool_result

__all__ = ["BridgeContext", "build_server", "render_text", "serve", "to_tool_result"]

if not TYPE_CHECKING:  # mypy sees the imports above, and no name beyond them
    __getattr__, __dir__ = lazy_exports(__name__, __file__)
