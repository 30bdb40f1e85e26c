"""An SDK server for tests/security/test_redteam_session_rules.py: a reader whose
parameter is a pydantic model (the SDK also accepts it as a JSON string,
``pre_parse_json``), a reader that names its file by a parameter called ``name``
(relative to the working directory), one that joins a name to a folder, a search that
returns the files it finds under ``TAINT_ROOT`` as embedded resources, and a sender. Each tool appends what it did to the file named
by ``TAINT_LOG`` (one JSON object a line)."""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import EmbeddedResource, TextResourceContents
from pydantic import BaseModel

app = MCPServer("visor-taint-reader")


def _record(tool: str, **fields: object) -> None:
    with open(os.environ["TAINT_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, **fields}) + "\n")


class ReadRequest(BaseModel):
    path: str


@app.tool()
def read_file(req: ReadRequest) -> str:
    """Read a file."""
    with open(req.path, encoding="utf-8") as f:
        text = f.read()
    _record("read_file", path=req.path)
    return text


@app.tool()
def read_doc(name: str) -> str:
    """Read a document by its name."""
    with open(name, encoding="utf-8") as f:
        text = f.read()
    _record("read_doc", name=name)
    return text


@app.tool()
def read_in(folder: str, name: str) -> str:
    """Read a document from a folder."""
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        text = f.read()
    _record("read_in", folder=folder, name=name)
    return text


@app.tool()
def find(term: str) -> list[EmbeddedResource]:
    """Find documents whose name holds a term."""
    found = []
    for folder, _dirs, files in os.walk(os.environ["TAINT_ROOT"]):
        for name in sorted(files):
            if term in name:
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                found.append(
                    EmbeddedResource(
                        type="resource", resource=TextResourceContents(uri=f"file://{path}", text=text)
                    )
                )
    _record("find", term=term)
    return found


@app.tool()
def send(to: str, body: str = "") -> str:
    """Send a message."""
    _record("send", to=to, body=body)
    return "sent"


if __name__ == "__main__":
    app.run()
