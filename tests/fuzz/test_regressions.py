"""Regression tests for what fuzzing found.

Each test names the input that broke an invariant. Bugs fixed in visor/wire
are plain tests; bugs that belong to another owner are ``xfail(strict=True)``
with the reason, so the suite stays green and turns red when the fix lands
(remove the mark then).
"""

from __future__ import annotations

import orjson
import pytest

from tests.fuzz import invariants
from visor.policy.loader import PolicyError, load_policy_text
from visor.wire.framer import Framer, Oversize
from visor.wire.message import Message, Rejected, classify


def _frames(chunks: list[bytes], limit: int) -> list:
    f = Framer(max_bytes=limit)
    out: list = []
    for c in chunks:
        out.extend(f.feed(c))
    return out + f.eof()


def _env(params: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"x","params":' + params + b"}"


# --- visor/wire: found by the wire target, fixed in the same commit ----------


@pytest.mark.parametrize("depth", [253, 254, 255, 300, 1000, 1018])
def test_deep_ascii_line_does_not_raise(depth: int) -> None:
    # orjson.loads accepts 1024 levels but orjson.dumps refuses more than 254:
    # the colon count re-encoded the object and let JSONEncodeError (a
    # TypeError) escape classify().
    line = _env(b'{"a":' + b"[" * depth + b"]" * depth + b"}")
    # from the client: refused past 64 levels (visor.wire.message.MAX_DEPTH), never raised
    refused = classify(line)
    assert isinstance(refused, Rejected) and "nested deeper" in refused.reason
    assert isinstance(classify(line, fold_case=False), Message)
    dup = _env(b'{"a":1,"a":' + b"[" * depth + b"]" * depth + b"}")
    assert isinstance(classify(dup), Rejected)
    folded = _env(b'{"a":1,"A":' + b"[" * depth + b"]" * depth + b"}")
    assert isinstance(classify(folded), Rejected)
    assert isinstance(classify(folded, fold_case=False), Message)
    shallow = _env(b'{"a":' + b"[" * 60 + b"]" * 60 + b"}")
    assert isinstance(classify(shallow), Message)


@pytest.mark.parametrize("depth", [900, 990, 1000, 1018])
def test_deep_line_with_unicode_escape_does_not_raise(depth: int) -> None:
    # Lines with \u go through json.loads, whose C scanner raises
    # RecursionError (not ValueError) well before orjson's 1024 levels.
    line = _env(b'{"\\u0061":' + b"[" * depth + b"]" * depth + b"}")
    r = classify(line)
    assert isinstance(r, Message | Rejected)
    if isinstance(r, Message):
        invariants.check_line(line)


def test_line_of_exactly_the_limit_with_crlf_split_across_chunks() -> None:
    # The CR of a CRLF counted against the limit while the LF had not arrived:
    # the same stream framed as a line or as Oversize depending on chunking.
    assert _frames([b"1234\r\n"], 4) == [b"1234"]
    assert _frames([b"1234\r", b"\n"], 4) == [b"1234"]
    assert _frames([b"x\n1234\r", b"\n"], 4) == [b"x", b"1234"]
    assert _frames([b"12", b"34\r", b"\n"], 4) == [b"1234"]
    # ... and one byte more is still too long, however it arrives.
    assert isinstance(_frames([b"12345\r", b"\n"], 4)[0], Oversize)
    assert isinstance(_frames([b"1234\r\r", b"\n"], 4)[0], Oversize)
    assert isinstance(_frames([b"1234\r", b"x\n"], 4)[0], Oversize)


def test_framer_holds_at_most_limit_plus_one() -> None:
    f = Framer(max_bytes=4)
    f.feed(b"1234\r")
    assert f.buffered == 5
    f.feed(b"\r")
    assert f.buffered == 0


# --- visor/wire: open differentials (owner: wire) -----------------------------


def test_integer_above_u64_is_not_accepted() -> None:
    line = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{"size":18446744073709551617}}}'
    m = classify(line)
    assert not isinstance(m, Message) or type(m.arguments["size"]) is int


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])
def test_unicode_line_separators_are_not_forwarded_raw(sep: str) -> None:
    line = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{"s":"a'
        + sep
        + 'b"}}}'
    ).encode()
    assert isinstance(classify(line), Rejected)


# --- visor/policy/loader: found by the policy target (owner: policy) ----------

_BASE = "servers:\n  - name: s\n    allowed: true\n    tools:\n      - name: t\n        allowed: true\n"
_LOADER_BUGS = [
    pytest.param(_BASE + '        allowed_path_prefixes: ["/a\\0b"]\n', id="nul-in-path-prefix-PathError"),
    pytest.param(
        _BASE + '        rules:\n          - type: allowed_repos\n            repos: ["[z-a]"]\n',
        id="bad-class-in-allowed_repos-re.error",
    ),
    pytest.param(
        _BASE + '        rules:\n          - type: deny_path\n            patterns: ["/a\\0/*"]\n',
        id="nul-in-absolute-glob-ValueError",
    ),
    pytest.param(
        _BASE + '        rules:\n          - type: deny_path\n            patterns: ["~x\\0/y"]\n',
        id="nul-in-tilde-glob-ValueError",
    ),
    pytest.param("description: " + "[" * 2000 + "]" * 2000 + "\n", id="deep-flow-yaml-RecursionError"),
    pytest.param(
        "time_restrictions:\n  - name: x\n    outside_action: deny\n    timezone: " + "a" * 300 + "\n",
        id="long-timezone-OSError",
    ),
    pytest.param(
        "time_restrictions:\n  - name: x\n    outside_action: deny\n    timezone: America\n",
        id="directory-timezone-IsADirectoryError",
    ),
    pytest.param(
        _BASE + '        arg_patterns:\n          x: "a{4294967296}"\n', id="huge-repeat-OverflowError"
    ),
    pytest.param(
        _BASE + '        arg_patterns:\n          x: "' + "(" * 1000 + ")" * 1000 + '"\n',
        id="deep-regex-RecursionError",
    ),
    pytest.param("description: x\ud800\n", id="lone-surrogate-UnicodeEncodeError"),
]


@pytest.mark.parametrize("text", _LOADER_BUGS)
def test_loader_raises_only_policy_error(text: str) -> None:
    # Each of these once escaped as another exception; each is refused, as a PolicyError.
    with pytest.raises(PolicyError):
        load_policy_text(text, "fuzz.yaml")


def test_loader_survives_what_fuzzing_tried() -> None:
    # Inputs the policy target tried that the loader handles.
    for text in (
        "servers: &a [*a]\n",
        "settings: &a {identity: *a}\n",
        "settings:\n  max_argument_size_bytes: " + "9" * 5000 + "\n",
        "settings:\n  <<: {log_level: info}\n",
        "description: !!python/object:os.system x\n",
    ):
        with pytest.raises(PolicyError):
            load_policy_text(text, "fuzz.yaml")


def test_every_big_number_form_is_classified() -> None:
    for text in (b"1e400", b"-1e400", b"1" * 400, b"9" * 5000, b"1e-400", b"-0", b"-0.0"):
        r = classify(_env(b'{"n":' + text + b"}"))
        if isinstance(r, Message):
            assert orjson.loads(text) == r.obj["params"]["n"]
