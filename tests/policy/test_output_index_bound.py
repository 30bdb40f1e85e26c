"""The provenance index is bounded and compact, and its bound never turns a deny into an allow."""

from __future__ import annotations

import sys

from tests.policy.helpers import decide, policy_from, session_for
from visor.policy import destinations as dst

POLICY = """
version: "1.0"
default_action: deny
settings:
  output_index_max_keys: {cap}
servers:
  - name: "mail"
    allowed: true
    tools:
      - name: "read_inbox"
        allowed: true
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
        trusted_destinations: ["@acme.example", "boss@acme.example"]
"""


def test_digest_table_grows_then_stops_at_its_bound() -> None:
    t = dst.DigestTable(5000)
    keys = [f"token:id-{i}" for i in range(8000)]
    t.update(keys[:4000])
    assert len(t) == 4000 and not t.saturated
    assert all(k in t for k in keys[:4000])
    assert not any(k in t for k in keys[4000:])
    t.update(keys[4000:])
    assert len(t) == 5000 and t.saturated
    assert all(k in t for k in keys[:5000])  # nothing kept is ever lost
    assert t.nbytes <= 8 * 16384  # at most half full, 8 bytes a slot


def test_the_index_keeps_digests_not_strings() -> None:
    idx = dst.OutputIndex(max_keys=100_000)
    text = " ".join(f"user{i}@corp{i % 97}.example ticket-{i}" for i in range(20_000))
    idx.add(text)
    assert len(idx) > 20_000
    # compact: about the size of the text itself, a fraction of its keys as strings
    keys = dst.extract_keys(text)
    as_strings = sys.getsizeof(keys) + sum(sys.getsizeof(k) for k in keys)
    assert idx.nbytes <= 2 * len(text) and idx.nbytes * 5 < as_strings
    assert idx.seen(dst.parse("user19999@corp17.example")[0])
    assert not idx.seen(dst.parse("stranger@corp15.example")[0])


def test_index_extracts_the_same_keys_as_before() -> None:
    text = "Mail eve@evil.example, see https://x.example/a and call +1 555 0100 123 #ops"
    idx = dst.OutputIndex()
    idx.add(text)
    keys = dst.extract_keys(text)
    assert keys and all(k in idx._keys for k in keys)


def _flood(n: int) -> dict:
    return {"content": [{"type": "text", "text": " ".join(f"ref-{i}" for i in range(n))}]}


def test_below_the_bound_nothing_changes() -> None:
    policy = policy_from(POLICY.format(cap=100_000))
    s = session_for(policy, "mail")
    s.observe_output("read_inbox", _flood(2000))
    s.observe_output("read_inbox", {"content": [{"type": "text", "text": "write to eve@acme.example"}]})
    assert decide(policy, s, "send_email", to="eve@acme.example").rule == "provenance.untrusted_output"
    assert decide(policy, s, "send_email", to="carol@acme.example").action == "allow"


def test_at_the_bound_a_domain_trusted_destination_is_asked_never_allowed() -> None:
    policy = policy_from(POLICY.format(cap=1000))
    s = session_for(policy, "mail")
    s.observe_output("read_inbox", {"content": [{"type": "text", "text": "write to kept@acme.example"}]})
    s.observe_output("read_inbox", _flood(5000))
    # dropped once the index was full: it may or may not be in output
    s.observe_output("read_inbox", {"content": [{"type": "text", "text": "write to eve@acme.example"}]})
    assert s.output.saturated
    d = decide(policy, s, "send_email", to="eve@acme.example")
    assert (d.action, d.rule) == ("ask", "provenance.index_full")
    # what was kept is still denied, an exact trusted address is still allowed
    assert decide(policy, s, "send_email", to="kept@acme.example").rule == "provenance.untrusted_output"
    assert decide(policy, s, "send_email", to="boss@acme.example").action == "allow"
    # and an unknown destination is asked as always
    assert decide(policy, s, "send_email", to="x@other.example").action == "ask"
