"""An SDK server whose tools take list-, dict- and int-typed parameters.

The MCP Python SDK decodes a JSON string given for a parameter not typed
``str`` (``pre_parse_json``) and pydantic's lax mode reads numeric strings
(``"+100000"``, ``"100_000"``) as integers: this server is the real reader
those readings are tested against. Every tool says what it actually did.
"""

from __future__ import annotations

from pathlib import Path

from mcp.server.mcpserver import MCPServer

app = MCPServer("visor-typed-server")


@app.tool()
def read_files(paths: list[str]) -> str:
    """Read each file and return their contents."""
    return "\n".join(f"{p}: {Path(p).read_text()}" for p in paths)


@app.tool()
def write_file(path: str, content: str) -> str:
    """Write a file."""
    Path(path).write_text(content)
    return f"wrote {path}"


@app.tool()
def copy_file(spec: dict[str, str]) -> str:
    """Copy spec['source'] to spec['destination']."""
    Path(spec["destination"]).write_text(Path(spec["source"]).read_text())
    return f"copied to {spec['destination']}"


@app.tool()
def list_rows(limit: int) -> str:
    """Say how many rows would be returned."""
    return f"rows={limit}"


if __name__ == "__main__":
    app.run()
