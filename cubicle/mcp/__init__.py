"""Cubicle as an MCP server: `cubicle mcp` (stdio) and `/mcp` on the service."""
