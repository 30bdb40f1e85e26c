// A server written with the TypeScript SDK's McpServer that serves files as a resource template.
// The SDK reads every resources/read URI with `new URL()` (WHATWG) before matching templates, so
// the file it opens is the one the WHATWG reading names. Run with the node in .venv/node.
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";

const sdk = new URL("../../.venv/node/node_modules/@modelcontextprotocol/sdk/dist/esm/", import.meta.url);
const { McpServer, ResourceTemplate } = await import(new URL("server/mcp.js", sdk));
const { StdioServerTransport } = await import(new URL("server/stdio.js", sdk));

const server = new McpServer({ name: "node-resources", version: "1.0.0" });
server.registerResource(
  "file",
  new ResourceTemplate("file:///{+path}", { list: undefined }),
  { description: "a file on disk" },
  async (uri) => ({
    contents: [{ uri: uri.href, text: await readFile(fileURLToPath(uri), "utf8") }],
  }),
);
await server.connect(new StdioServerTransport());
