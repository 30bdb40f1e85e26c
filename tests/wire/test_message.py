"""Every row of the wire rules, at the validator."""

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from visor.wire.errors import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR
from visor.wire.message import Kind, Message, Rejected, classify


def rej(line: bytes) -> Rejected:
    r = classify(line)
    assert isinstance(r, Rejected), r
    return r


def test_valid_request_notification_response() -> None:
    req = classify(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert isinstance(req, Message) and req.kind is Kind.REQUEST and req.id == 1
    note = classify(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert isinstance(note, Message) and note.kind is Kind.NOTIFICATION
    resp = classify(b'{"jsonrpc":"2.0","id":"a","result":{}}')
    assert isinstance(resp, Message) and resp.kind is Kind.RESPONSE and resp.id == "a"
    err = classify(b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"x"}}')
    assert isinstance(err, Message) and err.kind is Kind.RESPONSE


@pytest.mark.parametrize(
    ("line", "code", "null_reply"),
    [
        (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}', PARSE_ERROR, True),
        (b'{"jsonrpc":"2.0","id":1,"method":"p\xff"}', PARSE_ERROR, True),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"', PARSE_ERROR, True),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"} {}', PARSE_ERROR, True),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}x', PARSE_ERROR, True),
        (b'{"jsonrpc":"2.0",\r"id":1,"method":"ping"}', PARSE_ERROR, True),
        (b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}', PARSE_ERROR, True),
        (b'"just a string"', INVALID_REQUEST, True),
    ],
)
def test_unparseable_lines_answer_with_null_id(line: bytes, code: int, null_reply: bool) -> None:
    r = rej(line)
    assert r.code == code
    assert r.reply_null is null_reply and r.reply_ids == ()


@pytest.mark.parametrize(
    "id_text",
    [
        b"null",
        b"true",
        b"false",
        b"1.5",
        b"1e3",
        b"{}",
        b"[]",
        b"9223372036854775808",
        b"-9223372036854775809",
    ],
)
def test_request_ids_must_be_string_or_int64(id_text: bytes) -> None:
    r = rej(b'{"jsonrpc":"2.0","id":' + id_text + b',"method":"ping"}')
    assert r.code == INVALID_REQUEST and r.reply_null and r.reply_ids == ()


@pytest.mark.parametrize("value", [9223372036854775807, -9223372036854775808, 2**53 + 1, 0, ""])
def test_int64_and_string_ids_are_kept_exactly(value: object) -> None:
    line = orjson.dumps({"jsonrpc": "2.0", "id": value, "method": "ping"})
    m = classify(line)
    assert isinstance(m, Message) and m.id == value and type(m.id) is type(value)


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"1.0","id":5,"method":"ping"}',
        b'{"id":5,"method":"ping"}',
        b'{"jsonrpc":2.0,"id":5,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":5,"method":7}',
        b'{"jsonrpc":"2.0","id":5,"method":"ping","params":[1]}',
        b'{"jsonrpc":"2.0","id":5,"method":"ping","params":"x"}',
        b'{"jsonrpc":"2.0","id":5,"method":"ping","extra":1}',
    ],
)
def test_envelope_errors_answer_with_the_id(line: bytes) -> None:
    r = rej(line)
    assert r.code == INVALID_REQUEST and r.reply_ids == (5,)


def test_batches_are_rejected_with_an_error_per_valid_id() -> None:
    r = rej(
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}},'
        b'{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":"b","method":"ping"},{"jsonrpc":"2.0","id":null,"method":"x"}]'
    )
    assert r.code == INVALID_REQUEST and r.reply_ids == (1, "b") and not r.reply_null
    empty = rej(b"[]")
    assert empty.reply_ids == () and empty.reply_null


@pytest.mark.parametrize(
    ("line", "ids"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping"}', (1,)),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call"}', (1,)),
        (b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}', ()),
        (b'{"jsonrpc":"2.0","id":1,"ID":2,"method":"ping"}', ()),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"to":"x","to":"y"}}}',
            (1,),
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"a":[{"k":1,"K":2}]}}}',
            (1,),
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"to":"x","\\u0074o":"y"}}}',
            (1,),
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a:b","arguments":{"t":"x:y","t":1}}}',
            (1,),
        ),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"\\u212a":1,"k":2}}', (1,)),
    ],
)
def test_duplicate_keys_at_any_depth_are_rejected(line: bytes, ids: tuple) -> None:
    r = rej(line)
    assert r.code == INVALID_REQUEST and r.reply_ids == ids and not r.reply_null


def test_colons_in_strings_do_not_look_like_duplicates() -> None:
    line = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a:b::","arguments":{"u":"http://x:1/","l":["a:b",{"c:d":":"}]}}}'
    assert isinstance(classify(line), Message)
    escaped = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"u":"\\u003a","v":"\\u00e9"}}}'
    assert isinstance(classify(escaped), Message)


def test_tool_call_as_notification_is_dropped_without_answer() -> None:
    r = rej(b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email","arguments":{}}}')
    assert not r.answered and r.method == "tools/call"


@pytest.mark.parametrize(
    "params",
    [
        b'{"arguments":{}}',
        b'{"name":7}',
        b'{"name":""}',
        b'{"name":"x","arguments":[]}',
        b'{"name":"x","arguments":"a"}',
    ],
)
def test_tool_call_params_shape_is_invalid_params_with_id(params: bytes) -> None:
    r = rej(b'{"jsonrpc":"2.0","id":"q","method":"tools/call","params":' + params + b"}")
    assert r.code == INVALID_PARAMS and r.reply_ids == ("q",)


def test_tool_call_fields() -> None:
    m = classify(
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"a":[1]}}}'
    )
    assert isinstance(m, Message) and m.tool == "echo" and m.arguments == {"a": [1]}
    bare = classify(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo"}}')
    assert isinstance(bare, Message) and bare.arguments == {}


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}',
        b'{"jsonrpc":"2.0","id":1,"error":{"code":"1","message":"x"}}',
        b'{"jsonrpc":"2.0","id":1,"result":[]}',
        b'{"jsonrpc":"2.0","id":null,"result":{}}',
        b'{"jsonrpc":"2.0","result":{}}',
    ],
)
def test_malformed_responses_are_rejected(line: bytes) -> None:
    assert isinstance(classify(line), Rejected)


# --- properties -------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=5), st.integers(0, 2**63 - 1))
def test_accepted_messages_round_trip_and_keep_their_bytes(arguments: dict, msg_id: int) -> None:
    obj = {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": "t", "arguments": arguments},
    }
    line = json.dumps(obj, ensure_ascii=False).encode()
    m = classify(line)
    if isinstance(m, Message):
        assert m.raw is line and m.arguments == arguments
    else:
        # The only reasons to refuse a well-formed object: keys that fold
        # together, or a raw Unicode line separator a splitlines() reader would cut at.
        separators = any(c in line.decode() for c in "\x85\u2028\u2029")
        assert "case folding" in m.reason or (separators and "line separator" in m.reason)


def _pairs_have_duplicates(line: bytes) -> bool:
    found = False

    def hook(pairs: list) -> dict:
        nonlocal found
        keys = [k.casefold() for k, _ in pairs]
        if len(set(keys)) != len(keys):
            found = True
        return dict(pairs)

    json.loads(line, object_pairs_hook=hook)
    return found


keys = st.sampled_from(["a", "A", "b", "id", "ID", "to", "\u212a", "k", "a:b", ":"])
leaf = st.sampled_from(["1", '"x"', '"a:b"', '":"', '"\\u003a"', "null", "[]", '"\\u0041"'])


@st.composite
def raw_objects(draw: st.DrawFn, depth: int = 2) -> str:
    members = draw(
        st.lists(st.tuples(keys, leaf if depth == 0 else st.one_of(leaf, raw_objects(depth - 1))), max_size=4)
    )
    return "{" + ",".join(f'"{k}":{v}' for k, v in members) + "}"


@given(raw_objects())
def test_no_accepted_message_has_duplicate_keys(args_text: str) -> None:
    line = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":' + args_text + "}}"
    ).encode()
    m = classify(line)
    if isinstance(m, Message):
        assert not _pairs_have_duplicates(line)
    else:
        assert _pairs_have_duplicates(line)


def _pairs_have_exact_duplicates(line: bytes) -> bool:
    found = False

    def hook(pairs: list) -> dict:
        nonlocal found
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            found = True
        return dict(pairs)

    json.loads(line, object_pairs_hook=hook)
    return found


@given(raw_objects(), st.sampled_from(["", "é", "x" * 9000]))
def test_server_direction_refuses_exact_duplicates_only(args_text: str, pad: str) -> None:
    line = ('{"jsonrpc":"2.0","id":1,"result":{"n":"' + pad + '","v":' + args_text + "}}").encode()
    m = classify(line, fold_case=False)
    assert isinstance(m, Message) != _pairs_have_exact_duplicates(line)


@pytest.mark.parametrize(
    ("method", "params", "member"),
    [
        ("tools/call", {"name": "w", "Arguments": {"path": "/x"}}, "Arguments"),
        ("tools/call", {"name": "w", "argument\u017f": {"path": "/x"}}, "argument\u017f"),
        ("tools/call", {"name": "w", "arguments": {}, "TASK": {"ttl": 1}}, "TASK"),
        ("tools/call", {"name": "w", "arguments": {}, "_META": {}}, "_META"),
        (
            "tools/call",
            {"name": "w", "arguments": {}, "_meta": {"progre\u017f\u017fToken": 1}},
            "progreſſToken",
        ),
        ("resources/read", {"URI": "file:///etc/passwd"}, "URI"),
        ("prompts/get", {"name": "p", "ARGUMENTS": {"path": "/x"}}, "ARGUMENTS"),
        ("notifications/cancelled", {"requestID": 1}, "requestID"),
    ],
)
def test_case_variants_of_protocol_members_are_refused(method: str, params: dict, member: str) -> None:
    """A Go server (encoding/json) reads these as the member they fold onto; Visor would not."""
    msg: dict = {"jsonrpc": "2.0", "method": method, "params": params}
    if not method.startswith("notifications/"):
        msg["id"] = 7
    r = rej(json.dumps(msg, ensure_ascii=False).encode())
    assert r.code == INVALID_PARAMS
    assert member in r.reason
    assert r.reply_ids == ((7,) if "id" in msg else ())


def test_exact_protocol_members_and_unrelated_names_pass() -> None:
    line = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{"Path":"/x"},"_meta":{"progressToken":1,"vendor/Name":2}}}'
    m = classify(line)
    assert isinstance(m, Message) and m.arguments == {"Path": "/x"}
    # the server direction is not refused for this (the client reads it)
    resp = classify(b'{"jsonrpc":"2.0","id":1,"result":{"Content":[]}}', fold_case=False)
    assert isinstance(resp, Message)
