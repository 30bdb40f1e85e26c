"""The approval model without I/O: ids, the call hash, scopes, and every parser."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from visor.approval import elicitation, model


def _req(**kw: object) -> model.ApprovalRequest:
    base: dict = dict(
        server="rec",
        tool="send_email",
        arguments={"to": "new@example.org", "body": "hi"},
        request_id=7,
        session="s1",
        rule="provenance.unknown_destination",
        reason="destination new@example.org in argument 'to' is not a trusted or approved destination",
        destination="email:new@example.org",
        argument="to",
        now=1000.0,
        timeout=30.0,
    )
    base.update(kw)
    return model.make_request(**base)


def test_ids_are_128_random_bits_and_never_repeat() -> None:
    ids = {model.new_approval_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(model.valid_id(i) and len(i) == 32 for i in ids)
    assert not model.valid_id("1") and not model.valid_id("../" + "a" * 29) and not model.valid_id("A" * 32)


def test_rpc_ids_use_the_reserved_prefix() -> None:
    rid = model.new_rpc_id()
    assert model.is_visor_rpc_id(rid) and rid != model.new_rpc_id()
    assert not model.is_visor_rpc_id(7) and not model.is_visor_rpc_id("srv-visor-1")


def test_call_hash_binds_every_part_of_the_call() -> None:
    h = model.call_hash("rec", "t", {"a": 1, "b": [1, 2]}, 7, "s1")
    assert h == model.call_hash("rec", "t", {"b": [1, 2], "a": 1}, 7, "s1")  # key order is not the call
    for other in (
        model.call_hash("rec2", "t", {"a": 1, "b": [1, 2]}, 7, "s1"),
        model.call_hash("rec", "t2", {"a": 1, "b": [1, 2]}, 7, "s1"),
        model.call_hash("rec", "t", {"a": 2, "b": [1, 2]}, 7, "s1"),
        model.call_hash("rec", "t", {"a": 1, "b": [1, 2]}, 8, "s1"),
        model.call_hash("rec", "t", {"a": 1, "b": [1, 2]}, "7", "s1"),
        model.call_hash("rec", "t", {"a": 1, "b": [1, 2]}, 7, "s2"),
    ):
        assert other != h
    # integers beyond 64 bits still hash (orjson refuses them)
    assert len(model.call_hash("rec", "t", {"n": 2**70}, 1, "s")) == 64


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=4))
def test_the_same_arguments_hash_the_same_in_any_order(args: dict) -> None:
    reordered = dict(reversed(list(args.items())))
    assert model.call_hash("s", "t", args, 1, "x") == model.call_hash("s", "t", reordered, 1, "x")


def test_remember_scope() -> None:
    assert model.remember_scope("provenance.unknown_destination", "to", "email:a@b.c") == "destination"
    assert model.remember_scope("servers[rec].tools[echo].approval_required", None, None) == "exact"
    assert model.remember_scope("servers[rec].tools[echo].require_approval_always", None, None) == "exact"
    # history-dependent asks cover one call only
    for rule in ("egress_controls[x]", "tool_chains[y]", "time_restrictions[z]", "pin.no_tools_list"):
        assert model.remember_scope(rule, None, None) is None


def test_describe_says_what_and_why() -> None:
    text = model.describe(_req())
    assert "send_email" in text and "new@example.org" in text and 'argument "to"' in text
    assert "provenance.unknown_destination" in text and "agent's request" in text
    long = model.describe(_req(arguments={"body": "x" * 5000}))
    # cut, never silently: how much is hidden and how to see it
    assert "[4702 of 5002 characters hidden]" in long and len(long) < 2000
    assert "NOT SHOWN: 4702 characters" in long and "visor approve --show" in long


def test_answer_file_counts_only_for_its_own_request() -> None:
    req = _req()
    good = model.answer_record(req.id, req.call_hash, True, True)
    assert model.parse_answer(good, req) == (True, True)
    assert model.parse_answer(model.answer_record(req.id, req.call_hash, False, True), req) == (False, False)
    other = _req(request_id=8)  # the same call under another request id
    assert model.parse_answer(model.answer_record(other.id, other.call_hash, True, False), req) is None
    assert model.parse_answer(model.answer_record(req.id, other.call_hash, True, False), req) is None
    assert model.parse_answer(model.answer_record(other.id, req.call_hash, True, False), req) is None
    for junk in (b"", b"yes", b"approve", b"{}", b"[1]", b'{"decision":"approve"}'):
        assert model.parse_answer(junk, req) is None
    tampered = json.loads(good)
    tampered["remember"] = "yes"
    assert model.parse_answer(json.dumps(tampered).encode(), req) is None


def test_remember_is_dropped_where_no_scope_exists() -> None:
    req = _req(rule="tool_chains[x]", destination=None, argument=None)
    assert model.parse_answer(model.answer_record(req.id, req.call_hash, True, True), req) == (True, False)


def test_pending_record_round_trip() -> None:
    req = _req()
    rec = model.parse_pending(model.pending_record(req, 123))
    assert rec is not None and rec["id"] == req.id and rec["call_hash"] == req.call_hash
    assert rec["expires"] == 1030.0 and rec["rememberable"] is True and rec["pid"] == 123
    assert model.parse_pending(b'{"format":"visor-approval-request-1","id":"../x","call_hash":"0"}') is None


def test_expiry_is_a_number_in_the_pending_record_or_none() -> None:
    rec = model.parse_pending(model.pending_record(_req(), 123))
    assert rec is not None and model.expiry(rec) == 1030.0
    assert model.expiry({**rec, "expires": 5}) == 5
    # a pending file may hold anything there: only an int or a float (not a bool) is a time
    for junk in (True, False, None, "1030", [1030]):
        assert model.expiry({**rec, "expires": junk}) is None
    assert model.expiry({"id": rec["id"]}) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("y", (True, False)),
        ("YES\n", (True, False)),
        ("r", (True, True)),
        ("", (False, False)),
        ("n", (False, False)),
        ("yess", (False, False)),
        ("approve", (False, False)),
    ],
)
def test_tty_answers(line: str, expected: tuple[bool, bool]) -> None:
    assert model.parse_tty_line(line, rememberable=True) == expected


def test_tty_remember_needs_a_scope() -> None:
    assert model.parse_tty_line("r", rememberable=False) == (False, False)


def test_elicitation_capability() -> None:
    assert elicitation.client_supports_form({"elicitation": {}})
    assert elicitation.client_supports_form({"elicitation": {"form": {}, "url": {}}})
    assert not elicitation.client_supports_form({"elicitation": {"url": {}}})
    assert not elicitation.client_supports_form({"sampling": {}})
    assert not elicitation.client_supports_form(None)
    assert not elicitation.client_supports_form({"elicitation": True})


def test_elicitation_schema_is_flat_and_primitive() -> None:
    params = elicitation.request_params(_req())
    schema = params["requestedSchema"]
    assert schema["type"] == "object" and schema["required"] == ["decision"]
    for prop in schema["properties"].values():
        assert prop["type"] in ("string", "boolean", "number", "integer")
    assert set(schema["properties"]) == {"decision", "remember"}
    assert "new@example.org" in params["message"]
    chain = elicitation.request_params(_req(rule="tool_chains[x]", destination=None, argument=None))
    assert set(chain["requestedSchema"]["properties"]) == {"decision"}


def _resp(result: object) -> dict:
    return {"jsonrpc": "2.0", "id": "visor-x", "result": result}


def test_elicitation_only_accept_with_approve_approves() -> None:
    req = _req()
    parse = elicitation.parse_response
    ok = parse(_resp({"action": "accept", "content": {"decision": "approve", "remember": True}}), req, "c")
    assert ok is not None and ok.approved and ok.remember and ok.channel == "elicitation"
    # the client's name is what the client says, never a person Visor identified
    assert ok.who == "client-reported:c" and ok.client_reported is True
    no = parse(_resp({"action": "accept", "content": {"decision": "deny"}}), req, None)
    assert no is not None and not no.approved and no.who == "client-reported:unknown" and no.client_reported
    for action in ("decline", "cancel"):
        ans = parse(_resp({"action": action}), req, None)
        assert ans is not None and not ans.approved
    # failures: never an approval
    for bad in (
        {"jsonrpc": "2.0", "id": "visor-x", "error": {"code": -32601, "message": "Method not found"}},
        _resp({"action": "accept"}),
        _resp({"action": "accept", "content": {"decision": "yes"}}),
        _resp({"action": "accept", "content": {"decision": "approve", "remember": "true"}}),
        _resp({"action": "approve"}),
        _resp([]),
    ):
        assert parse(bad, req, None) is None


def test_expired_requests_left_by_a_killed_visor_are_swept_at_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import time

    from visor.approval import model
    from visor.approval.directory import DirectoryChannel

    adir = tmp_path / "approvals"
    adir.mkdir(mode=0o700)

    def request(now: float) -> model.ApprovalRequest:
        return model.make_request(
            server="s", tool="send_email", arguments={"to": "a@b.example"}, request_id=1, session="x" * 16,
            rule="provenance.unknown_destination", reason="r", destination="email:a@b.example", argument="to",
            now=now, timeout=5,
        )  # fmt: skip

    old, fresh = request(time.time() - 3600), request(time.time())
    for req in (old, fresh):
        (adir / f"{req.id}.pending").write_bytes(model.pending_record(req, os.getpid()))
    (adir / f"{old.id}.answer").write_text("{}")
    DirectoryChannel(adir)
    assert sorted(p.name for p in adir.iterdir()) == [f"{fresh.id}.pending"]


@pytest.mark.parametrize(
    ("rule", "said", "never"),
    [
        ("provenance.unknown_destination", "has not appeared", None),
        ("provenance.untrusted_output_ask", "tool output showed it", "has not appeared"),
        ("provenance.third_party_output", "whoever wrote the record", "has not appeared"),
        ("provenance.index_full", "cannot tell", "has not appeared"),
    ],
)
def test_the_question_says_where_the_destination_came_from_as_the_rule_knows_it(
    rule: str, said: str, never: str | None
) -> None:
    text = model.describe(_req(rule=rule))
    assert said in text
    if never is not None:
        assert never not in text
