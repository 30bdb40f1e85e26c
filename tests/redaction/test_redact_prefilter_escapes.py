"""The redaction prefilter sees the raw JSON line, where a string's characters may be escaped.

`PatternSet.may_match` searches the raw line for a literal that every match of
a pattern contains, before the strings are decoded and the regexes run. A
policy pattern such as ``password="[^"]+"`` has the literal ``password="``,
but a JSON encoder writes that quote as ``\\"``: the plain literal is never in
the line, the prefilter said "cannot match", and the secret went through
unredacted (to the client, and to the server and the audit log). The same held
for a backslash (``\\\\``) and for the control characters with a short escape
(``\\n``, ``\\t``...).

These tests go through what the relay calls (`DataGuard.tool_result`,
`redact_call`, `notification`, with lines classified as the relay does), with
each message written by real encoders: Python's json.dumps (ASCII-only and
UTF-8), orjson, a PHP-style encoder that writes ``/`` as ``\\/``, and
JavaScript's JSON.stringify (node, when installed).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from visor import redact
from visor.core.events import AppendRecord
from visor.core.guard import DataGuard
from visor.policy.loader import load_policy_text
from visor.wire.message import Message, classify


@dataclass(frozen=True)
class Case:
    id: str
    regex: str  # a policy pattern, as written in the policy file
    text: str  # a string a tool returns or a client sends, holding the secret
    secret: str  # what must be gone after redaction


CASES = [
    # The tester's report: the literal prefix ends with a quote.
    Case("quote", r'password="[^"]+"', 'db config: password="hunter2" (do not share)', "hunter2"),
    # A pattern for JSON text inside a string: every quote of the literal is escaped.
    Case(
        "quotes-json-in-text",
        r'"api_key":\s*"(?P<secret>[A-Za-z0-9]{20})"',
        '{"api_key": "Zq8Wm2Lk5Rt7Yp1Nx4Cv"}',
        "Zq8Wm2Lk5Rt7Yp1Nx4Cv",
    ),
    # A backslash: written \\ by every encoder.
    Case("backslash", r"CORP\\svc_[A-Za-z0-9]{8}", r"logon as CORP\svc_Zx81Qm3p succeeded", "Zx81Qm3p"),
    Case(
        "backslash-path",
        r"C:\\Users\\[a-z]+\\\.secret\\[a-z0-9]{12}",
        r"read C:\Users\bob\.secret\k3y9f00ba5e1",
        "k3y9f00ba5e1",
    ),
    # A slash: most encoders write it as is; PHP's json_encode writes \/ (such lines are walked).
    # (No "://" in these texts: that is a built-in's literal, and would have the line walked anyway.)
    Case(
        "slash",
        r"vault\.example/v1/secret/[A-Za-z0-9]{16}",
        "GET vault.example/v1/secret/Ab12Cd34Ef56Gh78",
        "Ab12Cd34Ef56Gh78",
    ),
    Case(
        "slash-and-quote",
        r'path="/etc/app/secret/[a-z0-9]{10}"',
        'open path="/etc/app/secret/a1b2c3d4e5" now',
        "a1b2c3d4e5",
    ),
    # Control characters: \n and \t have short escapes; \x01 is always \u0001.
    Case(
        "newline",
        r"BEGIN SECRET\n(?P<secret>[A-Za-z0-9]{12})",
        "BEGIN SECRET\nAbc123Def456\nEND SECRET",
        "Abc123Def456",
    ),
    Case("tab", r"token:\t[0-9a-f]{16}", "name\tvalue\ntoken:\t0123456789abcdef\n", "0123456789abcdef"),
    Case("control-u0001", r"SOH\x01key=[0-9]{8}", "record SOH\x01key=31415926 end", "31415926"),
    # Non-ASCII: UTF-8 bytes, or \u escapes (surrogate pairs outside the BMP).
    Case("non-ascii", r"Schlüssel: [A-Z0-9]{12}", "Der Schlüssel: QW12ER34TY56 ist geheim", "QW12ER34TY56"),
    Case("non-bmp", r"🔑=[A-Za-z0-9]{12}", "vault 🔑=Zk9Lm3Np7Qr2 ok", "Zk9Lm3Np7Qr2"),
    Case("non-ascii-and-quote", r'clé="[^"]+"', 'la clé="s3cr3t-valeur" est là', "s3cr3t-valeur"),
    # Case-insensitive: the pattern has no usable prefix, or it ends at the (?i:...) group.
    Case("ignorecase", r'(?i)password="[^"]+"', 'PassWord="hunter2"', "hunter2"),
    Case("ignorecase-scoped", r'Token="(?i:sk)-[A-Za-z0-9]{10}"', 'Token="SK-Ab3De6Gh9J"', "Ab3De6Gh9J"),
]


def _policy(regex: str) -> Any:
    # A JSON string is a YAML double-quoted scalar; ensure_ascii=False keeps a
    # character outside the BMP one character (YAML would not join \\ud83d\\udd11).
    quoted = json.dumps(regex, ensure_ascii=False)
    return load_policy_text(
        "version: '1.0'\n"
        "default_action: allow\n"
        "redaction:\n"
        "  patterns:\n"
        f"    - {{name: policy-secret, regex: {quoted}}}\n"
        "  output_patterns:\n"
        f"    - {{name: policy-secret, regex: {quoted}}}\n",
        "test.yaml",
    )


def _messages(text: str) -> dict[str, dict[str, Any]]:
    return {
        "result": {
            "jsonrpc": "2.0",
            "id": 7,
            "result": {"content": [{"type": "text", "text": text}], "structuredContent": {"log": text}},
        },
        "call": {
            "jsonrpc": "2.0",
            "id": 8,
            "method": "tools/call",
            "params": {"name": "run", "arguments": {"note": text, "nested": [{"v": text}]}},
        },
        "notification": {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "data": text},
        },
    }


def _php(obj: Any) -> bytes:
    # PHP's json_encode without JSON_UNESCAPED_SLASHES/UNICODE: \/ and \uXXXX.
    return json.dumps(obj, separators=(",", ":")).replace("/", "\\/").encode()


ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "json.dumps": lambda obj: json.dumps(obj).encode(),
    "json.dumps-utf8": lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode(),
    "orjson": orjson.dumps,
    "php": _php,
}
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def js_lines() -> dict[tuple[str, str], bytes]:
    """Every test message as JavaScript's JSON.stringify writes it (one node run)."""
    if NODE is None:
        pytest.skip("node is not installed")
    keys = [(c.id, d) for c in CASES for d in _messages(c.text)]
    objs = [_messages(c.text)[d] for c in CASES for d in _messages(c.text)]
    script = (
        "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>"
        "process.stdout.write(JSON.parse(s).map(o=>JSON.stringify(o)).join('\\n')))"
    )
    out = subprocess.run(
        [NODE, "-e", script], input=json.dumps(objs).encode(), capture_output=True, check=True, timeout=60
    ).stdout
    lines = out.split(b"\n")
    assert len(lines) == len(keys)
    return dict(zip(keys, lines, strict=True))


def _run(case: Case, direction: str, raw: bytes) -> tuple[bytes, list[dict[str, Any]]]:
    """What the relay passes on for `raw`, and the audit records it writes."""
    records: list[dict[str, Any]] = []
    guard = DataGuard(
        _policy(case.regex), "srv", lambda a: records.append(a.event) if isinstance(a, AppendRecord) else None
    )
    msg = classify(raw, fold_case=direction == "call")
    assert isinstance(msg, Message), msg
    if direction == "result":
        out = guard.tool_result("run", msg)
    elif direction == "call":
        out = guard.redact_call(msg).raw
    else:
        out = guard.notification(msg)
    assert out is not None, "the message was passed on unchanged, secret and all"
    return out, records


def _check(case: Case, direction: str, raw: bytes) -> None:
    assert case.secret in json.dumps(orjson.loads(raw), ensure_ascii=False)  # really in the input
    out, records = _run(case, direction, raw)
    decoded = orjson.loads(out)
    as_text = json.dumps(decoded, ensure_ascii=False)
    assert case.secret not in as_text
    assert case.secret.encode() not in out
    # The audit record names the pattern (and never the secret).
    assert records and "policy-secret" in json.dumps(records)
    assert case.secret not in json.dumps(records, ensure_ascii=False)


@pytest.mark.parametrize("direction", ["result", "call", "notification"])
@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_policy_secret_is_redacted_however_the_line_escapes_it(
    case: Case, encoder: str, direction: str
) -> None:
    raw = ENCODERS[encoder](_messages(case.text)[direction])
    _check(case, direction, raw)


@pytest.mark.parametrize("direction", ["result", "call", "notification"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_policy_secret_is_redacted_in_json_stringify_output(
    case: Case, direction: str, js_lines: dict[tuple[str, str], bytes]
) -> None:
    _check(case, direction, js_lines[(case.id, direction)])


def test_the_prefilter_still_rules_out_lines_without_the_escaped_literal() -> None:
    """Sound, and still a filter: the escaped spelling is searched, not "always walk"."""
    pset = _policy(r'password="[^"]+"').redaction.engine.outputs
    assert pset.raw_screen is not None
    assert pset.may_match(json.dumps({"t": 'password="x"'}).encode())
    assert not pset.may_match(json.dumps({"t": "password is x, nothing else"}).encode())
    assert not pset.may_match(b'{"t":"password=x"}')


def test_a_lone_surrogate_in_a_literal_does_not_break_the_set() -> None:
    """Only \\uD800 can write it (orjson refuses it raw and alone), so its literal is never found raw."""
    pset = redact.build_set([*redact.BUILTIN, redact.Pattern("s", re.compile("abc\ud800x"), "[R]")])
    assert pset.raw_screen is not None
    assert not pset.may_match(b'{"t":"abc plain"}')
    assert pset.may_match(b'{"t":"abc\\ud800x"}')  # \u lines are always walked
    assert pset.may_match(b'{"t":"ghp_' + b"a" * 36 + b'"}')


@pytest.mark.parametrize(
    ("regex", "prefix"),
    [
        (r'password="[^"]+"', 'password="'),
        (r"(?i)password=", ""),
        (r"(?i:pass)word=", ""),
        (r"pass(?i:word)=", "pass"),
        (r"abcd|abce", "abc"),  # the parser keeps a prefix common to every branch
        (r"abc|xyz", ""),
        (r"abcx?y", "abc"),
        (r"abc*", ""),  # "ab" is too short to use
        (r"[a]bcd", "abcd"),  # a one-character class is a literal
        (r"[ab]bcd", ""),
        (r"^password=", ""),
        (r"(abc)def", ""),
        (r"(?=abc)abcdef", ""),
        (r"(?x) a b c \  d", "abc d"),
        (r"tok\tx\\y\"z", 'tok\tx\\y"z'),
    ],
)
def test_literal_prefix(regex: str, prefix: str) -> None:
    assert redact.literal_prefix(re.compile(regex)) == prefix
    assert redact.literal_prefix(re.compile(regex, re.IGNORECASE)) == ""


# ------------------------------------------------------------ properties

# Characters an encoder may or must escape, and some it never does.
SPECIAL = [*'"\\/\b\f\n\r\t\x00\x01\x1f\x7f', "é", "ü", "\u2028", "\U0001f511", "\ufeff"]
chars = st.one_of(st.sampled_from(SPECIAL), st.sampled_from("aZ09_-=:. "), st.characters(codec="utf-8"))
literals = st.text(chars, min_size=3, max_size=12)
noise = st.text(chars, max_size=30)
ENCODE: list[Callable[[Any], bytes]] = [
    lambda o: json.dumps(o).encode(),
    lambda o: json.dumps(o, ensure_ascii=False).encode(),
    orjson.dumps,
]


def _found(pset: redact.PatternSet, obj: dict[str, Any]) -> bool:
    findings: list[redact.Finding] = []
    redact.redact_value(obj, pset, "$", findings)
    return bool(findings)


@settings(max_examples=400)
@given(literals, noise, noise, st.sampled_from(range(len(ENCODE))), st.booleans())
@example('pw="', "a ", " b", 0, False)
@example("a\\b", "", "", 2, True)
@example("x\ny", "", "", 1, False)
def test_the_prefilter_never_says_no_when_redaction_finds_a_secret(
    lit: str, before: str, after: str, enc: int, in_key_too: bool
) -> None:
    regex = re.compile(re.escape(lit) + "[0-9]{4}")
    assert redact.literal_prefix(regex) == lit  # the pattern really is screened by its literal
    pset = redact.build_set([*redact.BUILTIN, redact.Pattern("p", regex, "[R]")])
    assert pset.raw_screen is not None
    text = before + lit + "2718" + after
    obj: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}
    if in_key_too:
        obj["result"]["meta"] = {lit: before}
    raw = ENCODE[enc](obj)
    assert _found(pset, obj)
    assert pset.may_match(raw)


@settings(max_examples=300)
@given(literals, st.lists(st.one_of(noise, literals), max_size=4), st.sampled_from(range(len(ENCODE))))
def test_prefilter_no_implies_redaction_finds_nothing(lit: str, strings: list[str], enc: int) -> None:
    """For any line: may_match False => the full redaction finds nothing (digits come from the noise)."""
    regex = re.compile(re.escape(lit) + "[0-9]?")
    pset = redact.build_set([*redact.BUILTIN, redact.Pattern("p", regex, "[R]")])
    obj = {"jsonrpc": "2.0", "id": 1, "result": {"s": strings}}
    raw = ENCODE[enc](obj)
    assert pset.may_match(raw) or not _found(pset, obj)


# Pieces of regexes: literals, classes, alternations, groups, repeats, anchors and flags.
PIECES = [
    "a",
    "b",
    "c",
    "A",
    "ab",
    "abc",
    "[ab]",
    "[a]",
    "(?:abc)",
    "(ab)",
    "a?",
    "b*",
    "c{0,2}",
    "(?:ab|ac)",
]
PIECES += ["ab|ac", "abc|abd", "(?i:ab)", r"\b", "^", "$", ".", "(?=a)", "(?!b)", "x+?", "|"]


@settings(max_examples=500)
@given(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=8),
    st.sampled_from(["", "(?i)", "(?s)", "(?x)"]),
    st.text(st.sampled_from("abcABCx \n"), max_size=40),
)
def test_every_match_starts_with_the_literal_prefix(pieces: list[str], flags: str, text: str) -> None:
    try:
        regex = re.compile(flags + "".join(pieces))
    except re.error:
        return
    prefix = redact.literal_prefix(regex)
    for m in regex.finditer(text):
        assert m.group(0).startswith(prefix), (regex.pattern, prefix, m.group(0))
