"""An SDK server that serves files as a resource template and completes their paths.

The common shape of a file server's completion: the partial path the client
sends is listed on disk, and the names found are the suggestions. Run as
``python sdk_files.py``.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.types import Completion, ResourceTemplateReference

app = MCPServer("sdk-files")


@app.resource("file:///{path}")
def read(path: str) -> str:
    with open("/" + path, encoding="utf-8") as fh:
        return fh.read()


@app.completion()
async def complete(ref, argument, context):  # type: ignore[no-untyped-def]
    if not isinstance(ref, ResourceTemplateReference) or argument.name != "path":
        return None
    folder, _, start = ("/" + argument.value).rpartition("/")
    try:
        names = sorted(os.listdir(folder or "/"))
    except OSError:
        return Completion(values=[])
    return Completion(values=[f"{folder}/{n}".lstrip("/") for n in names if n.startswith(start)][:100])


if __name__ == "__main__":
    app.run()
