"""Case-insensitive decoding, against a real Go server built from source.

Go's ``encoding/json`` fills a struct field from any member whose name
matches it under Unicode simple case folding. tests/servers/go_fs is an MCP
server written that way; tests/servers/go_fold prints Go's own folding
table. The Go server is first shown to act on the variants (so the
differential is real), then the same bytes go through a real ``visor run``
and must never reach it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import VisorProcess
from visor.wire.folding import go_fold

SERVERS = Path(__file__).parents[1] / "servers"


@pytest.fixture(scope="module")
def go_build(tmp_path_factory: pytest.TempPathFactory):
    go = shutil.which("go")
    if go is None:
        pytest.skip(
            "go is not installed (Debian's golang-go; `make test` installs it): "
            "the Go decoding differential needs a real Go binary"
        )
    work = tmp_path_factory.mktemp("go")
    env = {
        **os.environ,
        "HOME": str(work),
        "GOCACHE": str(work / "cache"),
        "GOPATH": str(work / "gopath"),
        "GO111MODULE": "off",
        "GOFLAGS": "",
        "CGO_ENABLED": "0",
    }

    def build(name: str) -> Path:
        out = work / name
        subprocess.run(
            [go, "build", "-o", str(out), str(SERVERS / name / "main.go")],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        return out

    return build


def test_go_fold_matches_go_over_every_code_point(go_build) -> None:
    """Every pair of names a Go server matches, Visor's go_fold matches too
    (it may match more, which only refuses more)."""
    table = subprocess.run([str(go_build("go_fold"))], capture_output=True, check=True, timeout=60).stdout
    rep = {}
    for line in table.decode().splitlines():
        a, b = line.split()
        rep[int(a)] = int(b)
    classes: dict[int, list[int]] = defaultdict(list)
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        classes[rep.get(cp, cp)].append(cp)
    split = [
        [hex(m) for m in members]
        for members in classes.values()
        if len(members) > 1 and len({go_fold(chr(m)) for m in members}) > 1
    ]
    assert split == []
    # the examples from the wild
    assert go_fold("argument\u017f") == go_fold("arguments")
    assert go_fold("\u212aey") == go_fold("key")


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _write(msg_id: int, params: dict) -> bytes:
    return _line({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})


def _variants(target: Path) -> list[bytes]:
    """tools/call and resources/read lines that a Go server reads as writing or reading ``target``."""
    p = str(target)
    return [
        _write(11, {"name": "write_file", "Arguments": {"path": p, "content": "x"}}),
        _write(12, {"name": "write_file", "ARGUMENTS": {"path": p, "content": "x"}}),
        _write(13, {"name": "write_file", "argument\u017f": {"path": p, "content": "x"}}),
        _write(14, {"name": "write_file", "arguments": {"Path": p, "content": "x"}}),
        _write(15, {"name": "write_file", "arguments": {"PATH": p, "content": "x"}}),
        _write(16, {"name": "write_file", "arguments": {"pat\u0048": p, "content": "x"}}),
    ]


def test_the_go_server_acts_on_every_variant(go_build, tmp_path: Path) -> None:
    """Ground truth: without Visor, the Go server writes the file for every variant."""
    server = go_build("go_fs")
    for i, line in enumerate(_variants(tmp_path / "outside")):
        target = tmp_path / f"outside-{i}"
        line = line.replace(str(tmp_path / "outside").encode(), str(target).encode())
        out = subprocess.run([str(server)], input=line, capture_output=True, timeout=30).stdout
        assert b'"isError":false' in out, (line, out)
        assert target.read_text() == "x", line


POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "gofs"
    allowed: true
    tools:
      - name: "write_file"
        allowed: true
        write_params: ["path"]
        allowed_path_prefixes: ["{root}"]
      - name: "read_file"
        allowed: true
        allowed_path_prefixes: ["{root}"]
"""


@pytest.fixture
def gofs(go_build, tmp_path: Path):
    server = go_build("go_fs")
    root = tmp_path / "sandbox"
    root.mkdir()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(root=root))
    vp = VisorProcess(
        [str(server)],
        visor_args=[
            "--server-name",
            "gofs",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert len(vp.recv()["result"]["tools"]) == 2
    yield vp, root
    vp.kill()


def test_case_variants_never_reach_the_go_server(gofs, tmp_path: Path) -> None:
    vp, root = gofs
    outside = tmp_path / "outside"
    for line in _variants(outside):
        vp.send(line)
        resp = vp.recv()
        sent_id = json.loads(line)["id"]
        assert resp["id"] == sent_id
        denied = "error" in resp or resp["result"].get("isError") is True
        assert denied, (line, resp)
        text = json.dumps(resp)
        assert "case variant" in text or "outside" in text, text
    vp.request({"jsonrpc": "2.0", "id": 99, "method": "ping"})
    assert vp.recv()["id"] == 99
    assert not outside.exists()
    # the ordinary call still works, through the same session
    vp.send(_write(20, {"name": "write_file", "arguments": {"path": str(root / "ok.txt"), "content": "ok"}}))
    resp = vp.recv()
    assert resp["result"]["isError"] is False, resp
    assert (root / "ok.txt").read_text() == "ok"


def test_a_case_variant_resource_uri_is_refused(gofs, tmp_path: Path) -> None:
    vp, _root = gofs
    secret = tmp_path / ".env"
    secret.write_text("TOKEN=1")
    line = _line(
        {"jsonrpc": "2.0", "id": 31, "method": "resources/read", "params": {"URI": f"file://{secret}"}}
    )
    # ground truth: the Go server reads URI as uri and hands the file over
    server = str(Path(vp.proc.args[-1]))
    direct = subprocess.run([server], input=line, capture_output=True, timeout=30)
    assert b"TOKEN=1" in direct.stdout
    vp.send(line)
    resp = vp.recv()
    assert resp["id"] == 31 and resp["error"]["code"] == -32602, resp
    assert "case variant" in resp["error"]["message"]
    assert "TOKEN" not in json.dumps(resp)
