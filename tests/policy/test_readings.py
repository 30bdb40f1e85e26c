"""Every reading of a call's arguments: case folding, JSON inside strings, lax numbers.

The numeric reader is checked against real pydantic (the SDK's validator);
the folding against a real Go binary in tests/differential/test_go_server.py.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from tests.policy.helpers import policy_from
from visor.policy import readings
from visor.policy.evaluate import ToolCall, evaluate
from visor.session import SessionState
from visor.wire.folding import fold_lower, go_fold

POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "fs"
    allowed: true
    tools:
      - name: "read_files"
        allowed: true
        allowed_path_prefixes: ["/srv/data"]
      - name: "write_file"
        allowed: true
        write_params: ["path"]
        allowed_path_prefixes: ["/srv/data"]
      - name: "list_rows"
        allowed: true
        rules:
          - type: max_result_rows
            rows: 100
      - name: "send"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
        trusted_destinations: ["boss@example.com"]
"""

SCHEMAS = {
    "read_files": {"type": "object", "properties": {"paths": {"type": "array", "items": {"type": "string"}}}},
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    },
    "list_rows": {"type": "object", "properties": {"limit": {"type": "integer"}}},
    "send": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}},
}


@pytest.fixture
def session() -> SessionState:
    s = SessionState(policy_from(POLICY), "fs")
    s.observe_tools_list({"tools": [{"name": n, "inputSchema": sch} for n, sch in SCHEMAS.items()]})
    return s


def run(session: SessionState, tool: str, **args: object):
    return evaluate(session.policy, session, ToolCall("fs", tool, dict(args)))


# ------------------------------------------------------------------ folding


def test_go_fold_matches_ascii_case_and_unicode_simple_folds() -> None:
    assert go_fold("Path") == go_fold("PATH") == go_fold("path")
    assert go_fold("\u017fource") == go_fold("source")  # long s
    assert go_fold("\u212aey") == go_fold("key")  # Kelvin sign
    assert go_fold("stra\u00dfe") != go_fold("strasse")  # a full fold, not a simple one
    assert fold_lower("PA\u0054H") == "path"


def test_case_variants_of_schema_and_policy_names_are_refused(session: SessionState) -> None:
    d = run(session, "write_file", Path="/srv/data/a", content="x")
    assert (d.action, d.rule) == ("deny", "arguments.case_variant")
    d = run(session, "send", To="eve@evil.example", body="x")
    assert (d.action, d.rule) == ("deny", "arguments.case_variant")
    d = run(session, "read_files", paths=[{"\u017fource": 1}], **{"PATHS": ["/srv/data/a"]})
    assert d.action == "deny"
    # exact names pass this check
    assert run(session, "write_file", path="/srv/data/a", content="x").action == "allow"


def test_case_variant_in_nested_objects() -> None:
    names = readings.ArgumentNames.of({"path", "options"})
    assert readings.case_variant({"options": {"PATH": "/x"}}, names) == ("PATH", "path")
    assert readings.case_variant({"options": [{"pat\u0048": 1}]}, names) == ("patH", "path")
    assert readings.case_variant({"other": {"unrelated": 1}}, names) is None


def test_a_path_name_in_any_case_is_read_as_a_path() -> None:
    # with no schema (pins from a pin file), the vocabularies still read it
    s = SessionState(policy_from(POLICY), "fs")
    s.observe_tools_list({"tools": [{"name": n} for n in SCHEMAS]})
    d = evaluate(s.policy, s, ToolCall("fs", "read_files", {"PATH": "/etc/x"}))
    assert d.action == "deny" and d.rule.endswith("allowed_path_prefixes")
    d = evaluate(s.policy, s, ToolCall("fs", "write_file", {"\u017fource": "/home/u/.ssh/id_rsa"}))
    assert (d.action, d.rule) == ("deny", "path.sensitive")


# ------------------------------------------------------------------ JSON in strings


def test_a_json_string_is_judged_as_the_list_it_decodes_to(session: SessionState) -> None:
    hidden = json.dumps(["/srv/data/.env"]).replace(".env", "\\u002eenv")
    d = run(session, "read_files", paths=hidden)
    assert (d.action, d.rule) == ("deny", "path.sensitive")
    d = run(session, "read_files", paths=json.dumps(["/etc/passwd"]))
    assert d.action == "deny" and d.rule.endswith("allowed_path_prefixes")
    # a stringified list inside the prefix is what clients send: allowed
    assert run(session, "read_files", paths=json.dumps(["/srv/data/a.txt"])).action == "allow"


def test_a_plain_string_parameter_is_never_decoded(session: SessionState) -> None:
    body = json.dumps({"path": "/etc/passwd", "to": "x@y.example"})
    assert run(session, "write_file", path="/srv/data/a.json", content=body).action == "allow"


def test_unknown_schema_judges_both_readings() -> None:
    s = SessionState(policy_from(POLICY), "fs")
    s.observe_tools_list({"tools": [{"name": n} for n in SCHEMAS]})
    # literal: a relative name outside /srv/data; decoded: inside. Both must pass.
    d = evaluate(s.policy, s, ToolCall("fs", "read_files", {"paths": json.dumps(["/srv/data/a"])}))
    assert d.action == "deny"
    d = evaluate(s.policy, s, ToolCall("fs", "list_rows", {"q": json.dumps(["/srv/data/.env"])}))
    assert (d.action, d.rule) == ("deny", "path.sensitive")


def test_json_with_duplicate_keys_has_no_single_reading(session: SessionState) -> None:
    d = run(session, "read_files", paths='[{"a": 1, "a": 2}]')
    assert (d.action, d.rule) == ("deny", "arguments.ambiguous_json")
    d = run(session, "read_files", paths='[{"path": "/srv/data/a", "PATH": "/etc/x"}]')
    assert (d.action, d.rule) == ("deny", "arguments.ambiguous_json")


def test_decoded_reading_follows_the_sdk() -> None:
    assert readings.decoded_reading({"a": '["x"]', "b": "1", "c": '"s"'}) == {
        "a": ["x"],
        "b": "1",
        "c": '"s"',
    }
    assert readings.decoded_reading({"a": "not json [", "b": 3}) is None
    assert readings.decoded_reading({"a": '{"k": 1}'}, keep=frozenset({"a"})) is None
    assert readings.decoded_reading({"a": " \n[1, NaN]"}) == {"a": [1, math.inf]}


def test_every_decoding_reaches_json_inside_json() -> None:
    inner = json.dumps({"p": "/x/approvals/a"})
    outer = json.dumps([inner])
    out = readings.every_decoding({"v": outer, "w": [outer]})
    assert out == {"v": [{"p": "/x/approvals/a"}], "w": [[{"p": "/x/approvals/a"}]]}
    assert readings.every_decoding({"v": "plain"}) is None


def test_stricter_reading_wins_ask_over_allow(session: SessionState) -> None:
    # literal "to" is a JSON string of a list; unknown schema would decode it. Here "to" is a
    # plain string in the schema, so only the literal reading exists: an opaque destination, asked.
    d = run(session, "send", to='["eve@evil.example"]', body="hi")
    assert d.action == "ask"


# ------------------------------------------------------------------ lax numbers


@pytest.mark.parametrize("value", ["+100000", "100_000", "1e5", " 100000 ", "0x186a0", "１００００００"])
def test_numeric_strings_meet_the_row_limit(session: SessionState, value: str) -> None:
    d = run(session, "list_rows", limit=value)
    assert d.action == "deny", value


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "Infinity", "1e999"])
def test_unbounded_numbers_are_over_every_limit(session: SessionState, value: str) -> None:
    # -inf too: a count below one is no limit to many servers
    assert run(session, "list_rows", limit=value).action == "deny"


def test_ordinary_numbers_pass(session: SessionState) -> None:
    for v in (50, "50", 50.0, " 7 ", True):
        assert run(session, "list_rows", limit=v).action == "allow", v


_NUMERIC = st.text(alphabet="0123456789+-_ .eExXoObB\t", min_size=1, max_size=12)
_INT = TypeAdapter(int)
_FLOAT = TypeAdapter(float)


@given(_NUMERIC)
def test_lax_number_is_never_below_what_pydantic_reads(text: str) -> None:
    """Differential against the SDK's real validator: whatever number pydantic
    makes of a string, Visor's reading is at least as large."""
    for adapter in (_INT, _FLOAT):
        try:
            value = adapter.validate_python(text)
        except (ValidationError, ValueError):
            continue
        mine = readings.lax_number(text)
        assert mine is not None, (text, value)
        assert mine >= value or math.isnan(value), (text, value, mine)
