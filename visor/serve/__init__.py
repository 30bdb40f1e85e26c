"""`visor serve`: a Streamable HTTP gateway, one Visor session per MCP session (docs/deploy.md)."""
