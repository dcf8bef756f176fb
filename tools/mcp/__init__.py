"""Tools of remote MCP servers (Model Context Protocol, Streamable HTTP), governed like in-process tools.

Modules: ``conf`` (``TOLLGATE["MCP_SERVERS"]`` profiles), ``client`` (one SDK connection), ``discovery`` (listing cached in
``tools.models.McpTool``), ``source`` (``tools.registry.Tool``s named ``server.tool``), ``startup``; docs/integrating.md#13-mcp-servers.
"""
