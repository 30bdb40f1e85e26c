// A minimal MCP stdio server written the way most hand-written Go servers
// are: encoding/json into structs. encoding/json matches member names to
// struct fields case-insensitively (Unicode simple folding), so this server
// is the real reader Visor's wire rules and argument checks are tested
// against. Tools: write_file(path, content), read_file(path); resources/read
// of file:// URIs.
package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
)

type request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

type callParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type fileArgs struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

type readParams struct {
	URI string `json:"uri"`
}

var out = bufio.NewWriter(os.Stdout)

func reply(id json.RawMessage, result interface{}) {
	b, _ := json.Marshal(map[string]interface{}{"jsonrpc": "2.0", "id": id, "result": result})
	out.Write(b)
	out.WriteString("\n")
	out.Flush()
}

func text(s string, isErr bool) map[string]interface{} {
	return map[string]interface{}{
		"content": []map[string]string{{"type": "text", "text": s}},
		"isError": isErr,
	}
}

func schema(props ...string) map[string]interface{} {
	p := map[string]interface{}{}
	for _, name := range props {
		p[name] = map[string]string{"type": "string"}
	}
	return map[string]interface{}{"type": "object", "properties": p, "required": props}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil || req.ID == nil {
			continue
		}
		switch req.Method {
		case "initialize":
			var p map[string]interface{}
			json.Unmarshal(req.Params, &p)
			reply(req.ID, map[string]interface{}{
				"protocolVersion": p["protocolVersion"],
				"capabilities":    map[string]interface{}{"tools": map[string]interface{}{}, "resources": map[string]interface{}{}},
				"serverInfo":      map[string]string{"name": "go-fs", "version": "1"},
			})
		case "ping":
			reply(req.ID, map[string]interface{}{})
		case "tools/list":
			reply(req.ID, map[string]interface{}{"tools": []map[string]interface{}{
				{"name": "write_file", "description": "Write a file", "inputSchema": schema("path", "content")},
				{"name": "read_file", "description": "Read a file", "inputSchema": schema("path")},
			}})
		case "tools/call":
			var p callParams
			json.Unmarshal(req.Params, &p)
			var a fileArgs
			json.Unmarshal(p.Arguments, &a)
			switch p.Name {
			case "write_file":
				if err := os.WriteFile(a.Path, []byte(a.Content), 0o644); err != nil {
					reply(req.ID, text(err.Error(), true))
				} else {
					reply(req.ID, text("wrote "+a.Path, false))
				}
			case "read_file":
				b, err := os.ReadFile(a.Path)
				if err != nil {
					reply(req.ID, text(err.Error(), true))
				} else {
					reply(req.ID, text(string(b), false))
				}
			default:
				reply(req.ID, text("unknown tool", true))
			}
		case "resources/read":
			var p readParams
			json.Unmarshal(req.Params, &p)
			path := strings.TrimPrefix(p.URI, "file://")
			b, err := os.ReadFile(path)
			if err != nil {
				reply(req.ID, map[string]interface{}{"contents": []interface{}{}})
			} else {
				reply(req.ID, map[string]interface{}{"contents": []map[string]string{{"uri": p.URI, "text": string(b)}}})
			}
		default:
			reply(req.ID, map[string]interface{}{})
		}
	}
}
