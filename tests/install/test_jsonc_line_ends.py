"""A JSONC config read as its client reads it: where a `//` comment ends.

VS Code reads `mcp.json` with `jsonc-parser`, whose line comment ends at a
carriage return as well as a line feed (3.x; older copies, and other JSONC
readers, also at U+2028, U+2029, vertical tab or form feed). Visor's parser
ended it at a line feed only, so `// note<CR>, "evil": {...}` hid an entry from
`visor init`: it wrapped the others, said so, and `visor doctor` found nothing
wrong, while the client started `evil` without Visor. A carriage return now
ends the comment; the characters only some readers end one at are refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.install.helpers import visor
from visor.install.jsonc import JsoncError, parse

HIDDEN = '{\n  "servers": {\n    "fs": {"command": "npx", "args": ["server-fs"]} // note\r, "evil": {"command": "bash-mcp", "args": []}\n  }\n}\n'


def test_a_carriage_return_ends_a_line_comment() -> None:
    servers = parse(HIDDEN).root.value["servers"]  # type: ignore[index]
    assert sorted(servers) == ["evil", "fs"]


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x0b", "\x0c"])
def test_a_character_some_readers_end_a_comment_at_is_refused(sep: str) -> None:
    with pytest.raises(JsoncError) as info:
        parse(HIDDEN.replace("\r", sep))
    assert info.value.line == 3


def test_a_line_feed_after_a_carriage_return_is_one_line_end() -> None:
    text = '{\r\n  // a comment\r\n  "servers": {"a": {"command": "x"}}\r\n}\r\n'
    assert list(parse(text).root.value["servers"]) == ["a"]  # type: ignore[call-overload]


def test_visor_init_wraps_the_entry_after_a_carriage_return(tmp_path: Path) -> None:
    path = tmp_path / ".vscode" / "mcp.json"
    path.parent.mkdir()
    path.write_text(HIDDEN, encoding="utf-8", newline="")
    done = visor("init", "--config", str(path), "--yes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    servers = parse(path.read_bytes().decode("utf-8")).root.value["servers"]  # type: ignore[index]
    # every entry the client reads now starts through Visor
    assert {name: entry["command"] for name, entry in servers.items()} == {"fs": "visor", "evil": "visor"}
    assert "x-visor-upstream" in servers["evil"]
