"""Records never carry an unbounded value: over a bound, a field becomes its SHA-256 and size.

The digest is of the field's canonical JSON (strings: their UTF-8), at any
depth: orjson writes only 254 levels, so deeper values are hashed by an
explicit walk, checked here against the standard library's encoder.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

import orjson
import pytest

from visor.audit import record as rec
from visor.core.digests import LineDigests as _LineDigests
from visor.wire.framer import Framer, Oversize, Truncated


def build(event: dict) -> rec.Encoded:
    return rec.build(
        event, session="0123456789abcdef" * 2, seq=0, prev=rec.GENESIS, ts="2026-05-04T09:30:00.123456Z"
    )


def reference(value: object) -> tuple[str, int]:
    """The canonical JSON of a float-free value, by the standard library, any depth."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    finally:
        sys.setrecursionlimit(old)
    return hashlib.sha256(text).hexdigest(), len(text)


def nested(depth: int) -> dict:
    value: object = {"leaf": "é\n", "n": 1}
    for i in range(depth - 1):
        value = [value, {"k": i}] if i % 2 else {"b": value, "a": [i, None, True]}
    return value  # type: ignore[return-value]


@pytest.mark.parametrize("depth", [33, 200, 254, 255, 256, 500, 1000, 1024])
def test_a_deep_field_is_replaced_by_its_digest_and_the_line_parses(depth: int) -> None:
    args = nested(depth)
    enc = build({"event": "deny", "tool": "echo", "id": 7, "args": args, "reason": "r"})
    parsed = rec.parse_line(enc.line[:-1]).record
    assert "args" not in parsed
    digest, size = reference(args)
    assert parsed["omitted"]["args"] == {
        "sha256": digest,
        "bytes": size,
        "why": f"nested deeper than {rec.MAX_DEPTH} levels",
    }
    assert parsed["tool"] == "echo" and parsed["id"] == 7
    assert len(enc.line) < 1024
    json.loads(enc.line)  # any JSON reader copes with it


def test_the_deep_walk_gives_the_same_digest_as_orjson_where_both_work() -> None:
    rng = random.Random(7)
    for _ in range(200):
        value = nested(rng.randint(1, 120))
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        assert rec.canonical_digest(value) == (hashlib.sha256(data).hexdigest(), len(data))
        assert rec.canonical_digest(value) == reference(value)


def test_large_strings_and_containers_are_omitted_never_cut() -> None:
    tool = "t" * 2_000_000
    secret = "s" * 3_000_000
    enc = build({"event": "deny", "tool": tool, "id": "i" * 10_000, "args": {"x": secret}, "reason": "why"})
    assert len(enc.line) < 1500
    assert b"tttt" not in enc.line and b"ssss" not in enc.line and b"iiii" not in enc.line
    parsed = rec.parse_line(enc.line[:-1]).record
    om = parsed["omitted"]
    assert om["tool"]["sha256"] == hashlib.sha256(tool.encode()).hexdigest()
    assert om["tool"]["bytes"] == 2_000_000
    assert om["id"]["bytes"] == 10_000
    assert om["args"] == {
        "sha256": hashlib.sha256(orjson.dumps({"x": secret})).hexdigest(),
        "bytes": len(secret) + 8,
        "why": f"larger than {rec.MAX_FIELD_BYTES} bytes",
    }
    assert parsed["reason"] == "why"


def test_bounds_at_the_edge() -> None:
    at = build({"event": "deny", "tool": "é" * (rec.MAX_STRING_BYTES // 2)}).record
    assert "omitted" not in at
    over = build({"event": "deny", "tool": "é" * (rec.MAX_STRING_BYTES // 2) + "x"}).record
    assert over["omitted"]["tool"]["bytes"] == rec.MAX_STRING_BYTES + 1
    # An allow keeps arguments up to the larger bound: they are what reached the server.
    args = {"content": "x" * 30_000}
    assert build({"event": "allow", "args": args}).record["args"] == args
    assert "args" not in build({"event": "deny", "args": args}).record
    depth32 = nested(rec.MAX_DEPTH)
    assert build({"event": "allow", "args": depth32}).record["args"] == depth32
    assert "args" in build({"event": "allow", "args": nested(rec.MAX_DEPTH + 1)}).record["omitted"]


def test_unencodable_values_are_still_a_loud_error() -> None:
    with pytest.raises(rec.RecordError, match="not encodable"):
        build({"event": "allow", "args": {"x": {1, 2}}})


# ------------------------------------------------------- the relay's line digests


def _events(limit: int, chunks: list[bytes]) -> tuple[list[object], list[dict]]:
    framer, digests = Framer(limit), _LineDigests(limit)
    events: list[object] = []
    found: list[dict] = []
    for chunk in chunks:
        digests.feed(chunk)
        events += [e for e in framer.feed(chunk) if type(e) is not bytes]
        found += list(digests.found)
        digests.found.clear()
    digests.eof()
    events += framer.eof()
    found += list(digests.found)
    return events, found


def test_line_digests_match_every_line_the_framer_drops_whatever_the_chunking() -> None:
    rng = random.Random(11)
    for _ in range(400):
        limit = rng.choice([1, 5, 16, 64])
        lines = [bytes(rng.choice(b"ab\r") for _ in range(rng.randint(0, 3 * limit))) for _ in range(6)]
        stream = b"\n".join(lines) + rng.choice([b"\n", b""])
        cuts = sorted(rng.sample(range(len(stream) + 1), min(len(stream) + 1, rng.randint(0, 12))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True) if b > a]
        events, found = _events(limit, chunks)
        assert len(events) == len(found), (limit, stream, chunks)
        complete = stream.split(b"\n")
        dropped = [
            line
            for i, line in enumerate(complete)
            if (i < len(complete) - 1 and len(line.removesuffix(b"\r")) > limit)
            or (i == len(complete) - 1 and line)
        ]
        assert [f["size"] for f in found] == [len(x) for x in dropped]
        assert [f["digest"] for f in found] == [hashlib.sha256(x).hexdigest() for x in dropped]
        for event, line in zip(events, dropped, strict=True):
            assert type(event) in (Oversize, Truncated)
            assert event.size in (len(line), len(line.removesuffix(b"\r")))
