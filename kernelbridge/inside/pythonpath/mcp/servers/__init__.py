"""One module per host MCP server granted to this session: ``from mcp.servers.<alias> import <tool>``.

The modules are made by ``mcp._kernelbridge_refresh()`` from the host's manifest and live only in
``sys.modules`` (there are no files here). Each holds the server's tool proxies (the same functions as
``mcp_<alias>.<tool>``), ``__all__``, ``SERVER`` (the real name), ``TOOLS`` (the tool records) and
``TOOL_MAP`` (alias -> record). Importing a server that is not granted raises ModuleNotFoundError.
"""
