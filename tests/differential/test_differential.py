"""Visor's reading of a message against how real servers read the same bytes.

For every line Visor would forward (client direction), each reader in
readers.py must see exactly one message with the same method, tool,
arguments and id (types included). Known open differentials are
``xfail(strict=True)`` below; everything else is a failure.
"""

from __future__ import annotations

import json
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.differential import readers
from tests.fuzz.invariants import first_difference
from tests.fuzz.make_corpus import WIRE_LINES
from visor.wire.message import Message, classify


def visor_read(line: bytes) -> readers.Read | None:
    m = classify(line)
    if type(m) is not Message:
        return None
    return readers.Read(m.method, m.tool, m.arguments, m.id)


def differentials(line: bytes, only: tuple[str, ...] = ()) -> list[str]:
    """Every way a reader disagrees with Visor about a line Visor forwards."""
    ours = visor_read(line)
    if ours is None:
        return []
    found = []
    for name, reader in readers.READERS.items():
        if only and name not in only:
            continue
        theirs = reader(line + b"\n")
        if len(theirs) != 1:
            found.append(f"{name}: {len(theirs)} messages")
            continue
        if theirs[0] is None:
            found.append(f"{name}: cannot parse it")
            continue
        diff = first_difference(list(ours), list(theirs[0]))
        if diff is not None:
            found.append(f"{name}: {diff[0]} is {diff[1]!r} for Visor, {diff[2]!r} for the server")
    return found


def _is_known(line: bytes, found: str) -> bool:
    # The two open differentials (see the xfail tests below).
    if found.startswith("splitlines:") and any(
        s in line for s in (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")
    ):
        return True
    return "for Visor" in found and "e+" in found.split("for Visor")[0]


# --------------------------------------------------------------- corpus

HAND_MADE = [line for line in WIRE_LINES if b"\n" not in line]


def _call(args: str, name: str = "t", msg_id: str = "1") -> bytes:
    return (
        '{"jsonrpc":"2.0","id":'
        + msg_id
        + ',"method":"tools/call","params":{"name":"'
        + name
        + '","arguments":'
        + args
        + "}}"
    ).encode()


EXTRA = [
    _call('{"recipient":"a@corp.example","rec\u0131pient":"x@evil.example"}'),
    _call('{"path":"/tmp/a","pa\u0442h":"/etc/passwd"}'),
    _call('{"\u212aey":1}'),
    _call('{"s":"\u017f"}'),
    '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0430me":"x","name":"y"}}'.encode(),
    '{"jsonrpc":"2.0","\u0131d":1,"id":2,"method":"ping"}'.encode(),
    '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","\u0430rguments":{},"arguments":{"a":1}}}'.encode(),
    _call('{"a":"\\u0000","b":"\\ud83d\\ude00","c":"\\/"}'),
    _call('{"n":-0,"f":-0.0,"e":1E2,"g":1e-7,"h":123456789012345678}'),
]


def test_hand_made_corpus_is_large_enough() -> None:
    assert len(HAND_MADE) + len(EXTRA) > 140


@pytest.mark.parametrize("line", HAND_MADE + EXTRA, ids=range(len(HAND_MADE) + len(EXTRA)))
def test_no_reader_reads_a_forwarded_line_differently(line: bytes) -> None:
    found = [f for f in differentials(line) if not _is_known(line, f)]
    assert not found, found


# Generated messages: keys that fold together or nearly, strings with
# separators and escapes, numbers around every boundary.
_keys = st.sampled_from(
    ["a", "A", "to", "TO", "id", "Id", "name", "\u212a", "k", "K", "\u017f", "s", "S", "\u0131", "I", "i",
     "\u0130", "\u00df", "ss", "\u1e9e", "\u03c3", "\u03c2", "\u03a3", "\u01c5", "\u2126", "\u03c9", "a:b", ":",
     "\u0442", "\u1c84", "\u1c85", "arguments", "Arguments"]
)  # fmt: skip
_strings = st.text(
    alphabet=st.sampled_from([*'ab:"\\\u2028\u2029\x85\r\n\t\x00\x0b\u00e9\U0001f600', "\ud800"]),
    max_size=6,
)
_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
)
_values = st.recursive(
    st.none() | st.booleans() | _numbers | _strings,
    lambda c: st.lists(c, max_size=3) | st.lists(st.tuples(_keys, c), max_size=3),
    max_leaves=12,
)


def _encode(value: object, ensure_ascii: bool) -> str:
    # Lists of (key, value) tuples are objects, written with their duplicates.
    if type(value) is list and value and all(type(p) is tuple for p in value):
        return (
            "{"
            + ",".join(
                json.dumps(k, ensure_ascii=ensure_ascii) + ":" + _encode(v, ensure_ascii) for k, v in value
            )
            + "}"
        )
    if type(value) is list:
        return "[" + ",".join(_encode(v, ensure_ascii) for v in value) + "]"
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii)
    except (ValueError, UnicodeEncodeError):
        return "null"


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.tuples(_keys, _values), max_size=4),
    st.sampled_from(["1", '"x"', "9223372036854775807", "-1"]),
    st.booleans(),
)
def test_generated_messages(args: list, msg_id: str, ensure_ascii: bool) -> None:
    text = _encode(args, ensure_ascii) if args else "{}"
    try:
        line = _call(text, msg_id=msg_id)
    except UnicodeEncodeError:
        return
    found = [f for f in differentials(line) if not _is_known(line, f)]
    assert not found, (line, found)


# --------------------------------------------------------------- folding


def test_go_folds_nothing_that_casefold_keeps_apart() -> None:
    """Visor refuses keys equal under str.casefold(); Go's encoding/json
    matches struct fields under its own simple folding. Every pair of
    code points Go folds together must also casefold together, or a key Go
    reads as `name` could slip past Visor as a different key."""
    classes: dict[int, set[str]] = {}
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        f = readers.go_fold_rune(cp)
        if f != cp or cp in classes:
            classes.setdefault(f, {chr(f).casefold()}).add(chr(cp).casefold())
    bad = {hex(k): v for k, v in classes.items() if len(v) > 1}
    assert not bad, bad


def test_go_fold_model_matches_known_go_results() -> None:
    # From Go's own tests and tables: Kelvin and long s fold to ASCII, the
    # Turkic i's do not, sharp s and capital sharp s share an orbit.
    assert readers.go_fold_name("\u212a") == "K"
    assert readers.go_fold_name("\u017f") == "S"
    assert readers.go_fold_name("\u0131") == "\u0131"
    assert readers.go_fold_name("\u0130") == "\u0130"
    assert readers.go_fold_name("\u1e9e") == readers.go_fold_name("\u00df")
    assert readers.go_fold_name("Name") == readers.go_fold_name("nAME") == "NAME"


def test_python_unicode_version_is_known() -> None:
    # The fold check above runs on this interpreter's Unicode tables.
    assert unicodedata.unidata_version >= "14.0.0"


# --------------------------------------------------------------- CR and line breaks


@pytest.mark.parametrize("sep", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"])
def test_other_line_breaks_are_never_forwarded(sep: str) -> None:
    # Raw CR is refused by rule; the C0 separators are control characters
    # JSON does not allow raw, in or out of strings.
    for line in (_call('{"s":"a' + sep + 'b"}'), _call('{"s":"ab"}' + sep)):
        assert visor_read(line) is None


def test_universal_newlines_cannot_split_a_forwarded_line() -> None:
    # Text-mode stdin (the MCP Python SDK) splits on \n, \r and \r\n only;
    # Visor refuses raw \r and JSON escapes \n, so one line stays one message.
    line = _call('{"s":"a\\r\\nb","t":"\\u2028\\u2029\\u0085"}')
    assert visor_read(line) is not None
    assert len(readers.universal_newlines_reader(line + b"\n")) == 1


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])
def test_raw_unicode_line_separators_are_refused(sep: str) -> None:
    # str.splitlines() would make several messages of this line, so Visor
    # does not forward it; the escaped form passes (see above).
    line = _call('{"s":"a' + sep + "{}" + sep + 'b"}')
    assert len(readers.splitlines_reader(line + b"\n")) > 1
    assert visor_read(line) is None


# --------------------------------------------------------------- numbers


@pytest.mark.parametrize("n", [2**63, 2**64 - 1, -(2**63)])
def test_integers_within_64_bits_are_read_exactly(n: int) -> None:
    line = _call('{"size":' + str(n) + "}")
    assert differentials(line) == []


@pytest.mark.parametrize("n", [2**64, 2**64 + 1, 10**30, -(2**63) - 1])
def test_integers_beyond_64_bits_are_refused(n: int) -> None:
    # orjson would read them as floats while the server reads the exact
    # integer: Visor refuses the message rather than judge another number.
    assert visor_read(_call('{"size":' + str(n) + "}")) is None


def test_big_integer_ids_are_refused_not_rounded() -> None:
    # An id is matched to its response: one read as a float would answer
    # the wrong request. Ids outside int64 are refused outright.
    for n in (2**63, 2**64, 2**64 + 1, 10**30):
        assert visor_read(('{"jsonrpc":"2.0","id":' + str(n) + ',"method":"ping"}').encode()) is None
