"""MCP for AI agents: the shop's operations as tools.

* :mod:`vpsshop.mcp.tools`  the tools, one per customer operation of the REST API, over the same operations;
* :mod:`vpsshop.mcp.server` the shop's own MCP server at ``/mcp`` (streamable HTTP, the customer's API key);
* :mod:`vpsshop.mcp.bridge` ``vpsshop mcp``: those tools over stdio for an agent host that starts a command,
  relayed to any deployment's ``/mcp``.
"""
