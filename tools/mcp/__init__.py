"""Tools of remote MCP servers (Model Context Protocol, Streamable HTTP), governed like in-process tools.

* ``tools.mcp.conf``: the server profiles of ``TOLLGATE["MCP_SERVERS"]``.
* ``tools.mcp.client``: one connection to a server with the official ``mcp``
  SDK, its failures as ``tools.registry`` errors.
* ``tools.mcp.discovery``: the tool listing cached in ``tools.models.McpTool``,
  refreshed, a changed definition held until an operator accepts it.
* ``tools.mcp.source``: the cached tools as ``tools.registry.Tool``s (the
  registry's ``ToolSource`` for names ``server.tool``), and their calls.
* ``tools.mcp.startup`` (a surface): the profiles checked when Django starts,
  URL rules of webhooks included.

See docs/integrating.md#13-mcp-servers.
"""
