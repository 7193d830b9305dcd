"""The ``kernelbridge`` command line: a thin shell over each layer's API.

Layout (one module per command group; ``main`` builds the parser from them):

- ``main``        the parser, ``main(argv)``: one-line failures and exit statuses
- ``command``     what a group shares (the handler type, the sub-parsers type)
- ``serve``       ``serve`` (stdio or ``--http``)
- ``servers``     ``servers``: the host MCP servers found (MCP clients' files, ~/MCPs, ...) and where
- ``image``       ``image build``, ``image status``
- ``doctor``      ``doctor``: can this machine run sandboxes, and are their limits real
- ``sessions``    ``sessions``, ``attach``, ``export``: live sessions and their journals
- ``replay``      ``replay``: a notebook re-run in a fresh sandbox and judged
- ``kernelspec``  ``kernelspec install``
- ``setup``       ``setup``: this machine made ready, in one command
- ``skills``      ``skills list|show|rm``: the tools sandboxed code saved
- ``demo``        ``demo`` (the scripted session itself is :mod:`kernelbridge.demo`)

``[project.scripts] kernelbridge = "kernelbridge.cli:main"``; ``python -m kernelbridge.cli`` works too.
The distribution's own script, ``kernelbridge-mcp = "kernelbridge.cli:serve_main"``, is the same
command with ``serve`` as its default, so that ``uvx kernelbridge-mcp`` (and an ``mcpServers``
entry of just that) runs the server.
"""

from kernelbridge.cli.main import main, serve_main

__all__ = ["main", "serve_main"]
