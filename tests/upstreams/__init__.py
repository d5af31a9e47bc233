"""Upstream MCP servers the gateway tests put behind ``sandbox-runtime serve`` (each runs as its own process)."""
