"""Every refused client message leaves exactly one audit record, and no record carries it.

Through a real `visor run`: multi-megabyte refusals (over --max-message-bytes,
over the policy's argument-size limit, with a huge tool name, id or member
name) leave a log of a few kilobytes, each refusal by its SHA-256 and size;
calls nested 200 to 1025 levels deep and every other kind of wire refusal
get one verdict record each; `visor audit verify` accepts the log.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import RECORDER, VisorProcess, received
from visor.audit import record as rec

VERDICTS = {"allow", "deny", "reject"}


def _start(tmp_path: Path, *extra: str) -> tuple[VisorProcess, Path, Path]:
    audit = tmp_path / "audit.jsonl"
    got = tmp_path / "received.jsonl"
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(got)},
        visor_args=["--audit-log", str(audit), *extra],
    )
    vp.request({"jsonrpc": "2.0", "id": "setup-list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    got.write_bytes(b"")
    return vp, audit, got


def _drain(vp: VisorProcess, msg_id: int = 999_000) -> None:
    """Ping through the relay and read every answer up to the ping's: all before it was handled."""
    vp.request({"jsonrpc": "2.0", "id": msg_id, "method": "ping"})
    while vp.recv(timeout=60).get("id") != msg_id:
        pass


def _records(audit: Path) -> list[dict[str, Any]]:
    return [rec.parse_line(line).record for line in audit.read_bytes().splitlines()]


def _verify(audit: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "audit", "verify", str(audit)], capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(b"OK ")


def _depth(value: Any) -> int:
    best, stack = 0, [(value, 1)]
    while stack:
        node, d = stack.pop()
        if type(node) in (dict, list):
            best = max(best, d)
            stack.extend((c, d + 1) for c in (node.values() if type(node) is dict else node))
    return best


def _call(i: Any, args: Any, tool: str = "echo") -> bytes:
    msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool, "arguments": args}}
    return orjson.dumps(msg) + b"\n"


def test_multi_megabyte_refusals_leave_a_small_log_with_digests(tmp_path: Path) -> None:
    wire_limit = 2 * 1024 * 1024
    vp, audit, got = _start(tmp_path, "--max-message-bytes", str(wire_limit))
    oversize = [_call(100 + i, {"x": chr(97 + i) * (3 * 1024 * 1024)}) for i in range(4)]
    too_big_args = [{"x": chr(101 + i) * (1536 * 1024)} for i in range(4)]  # policy limit: 1 MiB
    huge_tool = _call(300, {}, tool="t" * (1536 * 1024))
    huge_id = _call("i" * (1536 * 1024), {"x": "y"}, tool="no_such_tool")
    huge_member = b'{"jsonrpc":"2.0","id":400,"method":"ping","' + b"m" * (1536 * 1024) + b'":1}\n'
    sent = 0
    try:
        for line in oversize:
            vp.send(line)
        for i, args in enumerate(too_big_args):
            vp.send(_call(200 + i, args))
        for line in (huge_tool, huge_id, huge_member):
            vp.send(line)
        sent = sum(map(len, oversize)) + sum(len(_call(0, a)) for a in too_big_args)
        sent += len(huge_tool) + len(huge_id) + len(huge_member)
        _drain(vp)
    finally:
        vp.kill()
    assert sent > 18_000_000
    assert received(got)[-1:] == [
        b'{"jsonrpc":"2.0","id":999000,"method":"ping"}\n'
    ]  # nothing else reached it
    size = audit.stat().st_size
    assert size < 24 * 1024, f"{size} bytes of audit log for {sent} bytes of refused calls"
    records = _records(audit)

    rejects = [r for r in records if r["event"] == "reject"]
    for line in oversize:
        body = line[:-1]
        match = [r for r in rejects if r.get("sha256") == hashlib.sha256(body).hexdigest()]
        assert len(match) == 1 and match[0]["bytes"] == len(body), match
        assert match[0]["reason"] == "message larger than the limit"

    denies = {r["id"]: r for r in records if r["event"] == "deny" and "id" in r}
    for i, args in enumerate(too_big_args):
        r = denies[200 + i]
        assert r["rule"] == "limits.argument_size" and "args" not in r
        data = orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
        assert r["omitted"]["args"]["sha256"] == hashlib.sha256(data).hexdigest()
        assert r["omitted"]["args"]["bytes"] == len(data)
    by_tool = [r for r in records if r.get("omitted", {}).get("tool")]
    assert by_tool and all(
        r["omitted"]["tool"]["sha256"] == hashlib.sha256(b"t" * (1536 * 1024)).hexdigest() for r in by_tool
    )
    by_id = [r for r in records if r.get("omitted", {}).get("id")]
    assert by_id and by_id[0]["omitted"]["id"]["bytes"] == 1536 * 1024
    member = [r for r in rejects if r.get("sha256") == hashlib.sha256(huge_member[:-1]).hexdigest()]
    assert len(member) == 1 and len(member[0]["reason"]) < 300
    _verify(audit)


DEPTHS = [200, 255, 256, 500, 1000, 1025]

OTHER_REFUSALS = [
    b'[{"jsonrpc":"2.0","id":501,"method":"ping"}]',  # a batch
    b'{"jsonrpc":"2.0","id":502,"id":503,"method":"ping"}',  # duplicate keys
    b'{"jsonrpc":"2.0","id":504,"ID":505,"method":"ping"}',  # duplicate after case folding
    b'{"jsonrpc":"2.0","id":[506],"method":"ping"}',  # an id that is no id
    b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}',
    b"not json at all",
    b'\xef\xbb\xbf{"jsonrpc":"2.0","id":507,"method":"ping"}',  # a byte order mark
    b'{"jsonrpc":"2.0","id":508,"method":"ping","params":{"a":"\xff\xfe"}}',  # not UTF-8
    b'{"jsonrpc":"2.0","id":509,"method":"ping","params":{"a":"x\ry"}}',  # a raw CR
    b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}',  # a call as a notification
    b'{"jsonrpc":"2.0","id":510,"method":"ping","params":[1]}',
    b'{"jsonrpc":"2.0","id":511,"method":"ping","extra":1}',
    b'{"jsonrpc":"2.0","id":512,"method":"tools/call","params":{"name":"echo","Arguments":{}}}',
    b'{"jsonrpc":"2.0","id":513,"method":"ping","params":{"n":123456789012345678901234567890}}',
    b'{"jsonrpc":"1.0","id":514,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":515,"result":{}}',  # a response to nothing
    b'{"jsonrpc":"2.0","id":516,"method":"tools/call","params":{"name":""}}',
    b'{"jsonrpc":"2.0","id":517,"method":"ping","params":{"a":"\xe2\x80\xa8"}}',  # U+2028
    b'"a string"',
]


def test_every_depth_and_every_wire_refusal_leaves_exactly_one_record(tmp_path: Path) -> None:
    vp, audit, got = _start(tmp_path)
    deep = {
        d: b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"x":' % d
        + b"[" * d
        + b"]" * d
        + b"}}}"
        for d in DEPTHS
    }
    partial = b'{"jsonrpc":"2.0","id":600,"method":"ping"'  # the stream ends inside it
    try:
        for line in [*deep.values(), *OTHER_REFUSALS]:
            vp.send(line + b"\n")
        _drain(vp)
        vp.send(partial)
    finally:
        vp.kill()
    records = _records(audit)
    verdicts = [r for r in records if r["event"] in VERDICTS]
    relayed = received(got)

    for d, line in deep.items():
        by_digest = [r for r in verdicts if r.get("sha256") == hashlib.sha256(line).hexdigest()]
        by_id = [r for r in verdicts if r.get("id") == d]
        mine = list({r["seq"]: r for r in by_digest + by_id}.values())
        assert len(mine) == 1, (d, mine)
        r = mine[0]
        if r["event"] == "allow":
            # The policy allows echo; what the server got is the exact line.
            assert line + b"\n" in relayed
        else:
            assert not any(b'"id":%d,' % d in x for x in relayed)
        if r["event"] != "reject":
            # The arguments are never in the record: only their digest and size.
            assert "args" not in r and r["omitted"]["args"]["why"].startswith("nested deeper")
            assert r["omitted"]["args"]["bytes"] == 6 + 2 * d
    # Past 64 levels no reading can be vouched for: refused at the wire, with the id answered.
    assert all(r["event"] == "reject" for d in DEPTHS if d > 62 for r in verdicts if r.get("id") == d or r.get("sha256") == hashlib.sha256(deep[d]).hexdigest())  # fmt: skip

    for line in [*OTHER_REFUSALS, partial]:
        mine = [r for r in verdicts if r.get("sha256") == hashlib.sha256(line).hexdigest()]
        assert len(mine) == 1, (line, mine)
        assert mine[0]["event"] == "reject" and mine[0]["bytes"] == len(line) and mine[0]["reason"]
        assert line not in relayed
    rejects = [r for r in verdicts if r["event"] == "reject"]
    assert len(rejects) == len(DEPTHS) + len(OTHER_REFUSALS) + 1  # every depth, the list, the partial line

    for raw in audit.read_bytes().splitlines():
        assert _depth(json.loads(raw)) <= rec.MAX_DEPTH + 2
    _verify(audit)
