"""The ``kernelbridge`` command line: a thin shell over each layer's API.

One module per command group; :mod:`.main` builds the parser from them. ``kernelbridge =
"kernelbridge.cli:main"`` (also ``python -m kernelbridge.cli``); ``kernelbridge-mcp =
"kernelbridge.cli:serve_main"`` is the same command with ``serve`` as its default, so that ``uvx
kernelbridge-mcp`` (or an ``mcpServers`` entry of just that) runs the server.
"""

from kernelbridge.cli.main import main, serve_main

__all__ = ["main", "serve_main"]
