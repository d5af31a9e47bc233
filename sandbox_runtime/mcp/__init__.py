"""The MCP interface: a server over stdio and streamable HTTP, and a gateway to upstream MCP servers."""
