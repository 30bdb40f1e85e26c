"""An SDK (MCPServer) server whose structured output and resources hold secrets."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

app = MCPServer("visor-secrets-server")

GITHUB = "ghp_" + "Q9w8E7r6" * 5


class Creds(BaseModel):
    user: str
    token: str
    port: int
    urls: list[str]


@app.tool()
def creds(user: str) -> Creds:
    """Structured output with a token in it."""
    return Creds(
        user=user, token=GITHUB, port=5432, urls=["postgres://app:hunter2@db/x", "https://ok.example"]
    )


@app.resource("memo://config")
def config() -> str:
    return f"TOKEN={GITHUB}\n"


if __name__ == "__main__":
    app.run()
