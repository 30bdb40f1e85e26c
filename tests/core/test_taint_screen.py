"""Resource content in an answer taints the session however its `uri` member is spelled: the
byte screen that spares answers without one must not spare one whose key is JSON-escaped."""

from __future__ import annotations

from tests.core.fake_wire import call, policy_wire

POLICY = """
version: "1.0"
default_action: allow
servers:
  - name: "srv"
    allowed: true
    tools:
      - {name: "*", allowed: true}
taints:
  - {name: payroll_read, source_tools: [nothing_reads], source_patterns: ["/srv/payroll/**"]}
"""


def _answer(raw_key: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"resource","resource":{'
        + raw_key.encode()
        + b':"file:///srv/payroll/2026.csv","text":"alice,100000"}}]}}'
    )


def test_an_embedded_resource_taints_with_its_key_plain_or_escaped() -> None:
    for key in ('"uri"', '"\\u0075ri"', '"u\\u0072i"'):
        wire = policy_wire(policy=POLICY)
        wire.commit_all(wire.client(call(1, "echo", text="x")))
        wire.server(_answer(key))
        assert wire.core.checks.session.taints == {"payroll_read"}, key


def test_an_answer_without_a_resource_taints_nothing() -> None:
    wire = policy_wire(policy=POLICY)
    wire.commit_all(wire.client(call(1, "echo", text="x")))
    wire.server(
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"/srv/payroll/2026.csv"}]}}'
    )
    assert wire.core.checks.session.taints == set()
