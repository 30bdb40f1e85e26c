import hashlib
import json

import pytest

from visor.audit import record as rec


def build(event, seq=0, prev=rec.GENESIS):
    return rec.build(event, session="s", seq=seq, prev=prev, ts="2026-05-04T09:30:00.000001Z")


def test_line_layout_and_hash_definition():
    enc = build({"event": "deny", "server": "fs", "tool": "t", "args": {"b": 1, "a": "é\n\x01"}})
    line = enc.line
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"hash":"') and line[73:75] == b'",'
    body = b"{" + line[75:-1]
    assert hashlib.sha256(rec.GENESIS.encode() + body).hexdigest() == enc.record["hash"]
    fields = {k: v for k, v in enc.record.items() if k != "hash"}
    # For float-free records the body is what any sorted, compact, raw-UTF-8 serialiser makes.
    expected = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert body == expected
    assert "é".encode() in body  # raw UTF-8, not \u00e9
    assert json.loads(line)["hash"] == enc.record["hash"]
    assert rec.parse_line(line[:-1]).record == enc.record


@pytest.mark.parametrize("rid", [7, 2**53 + 1, 2**63 - 1, 2**64 - 1, -(2**63), "req-7", ""])
def test_request_ids_are_kept_exactly(rid):
    enc = build({"event": "allow", "id": rid})
    assert rec.parse_line(enc.line[:-1]).record["id"] == rid
    assert type(json.loads(enc.line)["id"]) is type(rid)


def test_writer_fields_are_reserved_and_events_known():
    with pytest.raises(rec.RecordError, match="writer-owned"):
        build({"event": "allow", "seq": 3})
    with pytest.raises(rec.RecordError, match="unknown audit event"):
        build({"event": "alow"})
    with pytest.raises(rec.RecordError, match="not encodable"):
        build({"event": "allow", "args": {"n": 2**64}})
    with pytest.raises(rec.RecordError, match="not encodable"):
        build({"event": "allow", "args": {1: "non-string key"}})


def test_timestamp_format():
    ts = rec.utc_timestamp()
    assert len(ts) == 27 and ts.endswith("Z") and ts[10] == "T"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b"garbage", "corrupt"),
        (b'{"a":1}', "foreign"),
        (b"[1,2]", "foreign"),
    ],
)
def test_parse_line_classifies(line, kind):
    with pytest.raises(rec.RecordError) as info:
        rec.parse_line(line)
    assert info.value.kind == kind


def test_unknown_version_is_foreign():
    enc = build({"event": "allow"})
    fields = {k: v for k, v in enc.record.items() if k != "hash"}
    fields["v"] = 2
    body = rec.canonical_body(fields)
    digest = rec.chain_hash(rec.GENESIS, body)
    line = b'{"hash":"' + digest.encode() + b'",' + body[1:]
    with pytest.raises(rec.RecordError) as info:
        rec.parse_line(line)
    assert info.value.kind == "foreign"
