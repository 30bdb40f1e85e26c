"""Correlation in both directions, driven in memory: who may answer what, and what is consumed."""

from __future__ import annotations

import hashlib

from tests.core.fake_wire import line, plain_wire, policy_wire, records, request, result, to_client, to_server
from visor.core.events import ClientData, DeliverReply, SendToServer, VisorForget, VisorRequest

SAMPLING = request(
    "s1",
    "sampling/createMessage",
    {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]},
)


def test_a_request_goes_to_the_server_byte_for_byte_and_its_answer_back() -> None:
    wire = plain_wire()
    raw = b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{ "b":1,"a":2}}'
    out = wire.feed(ClientData(raw + b"\n"))
    assert [a.line for a in out if isinstance(a, SendToServer)] == [raw]
    answer = b'{"jsonrpc":"2.0","id":7,"result":{}}'
    back = wire.server(answer)
    assert [a.line for a in back if hasattr(a, "line")] == [answer]
    assert 7 not in wire.core.pending


def test_an_answer_to_no_request_is_dropped_and_recorded() -> None:
    wire = policy_wire()
    out = wire.server(result(99))
    assert to_client(out) == []
    assert [(r["event"], r["direction"], r["reason"]) for r in records(out)] == [
        ("reject", "server", "response to no request the client sent")
    ]


def test_an_id_already_in_flight_is_refused_and_the_first_request_kept() -> None:
    wire = plain_wire()
    wire.client(request(1, "ping"))
    out = wire.client(request(1, "ping"))
    assert to_server(out) == []
    assert to_client(out)[0]["error"]["code"] == -32600
    assert wire.core.pending[1].forwarded


def test_a_server_request_reaches_the_client_and_only_its_answer_goes_back() -> None:
    wire = policy_wire()
    out = wire.server(SAMPLING)
    assert to_client(out) == [SAMPLING]
    assert [r["event"] for r in records(out)] == ["allow"]
    assert to_server(wire.client(result("s1"))) == [result("s1")]
    # answered once: a second answer names no request
    again = wire.client(result("s1"))
    assert to_server(again) == []
    assert records(again)[0]["reason"] == "response to no request the server sent"


def test_a_server_request_in_visors_id_space_is_refused_and_never_reaches_the_client() -> None:
    wire = policy_wire()
    out = wire.server(request("visor-1234", "sampling/createMessage", {}))
    assert to_client(out) == []
    assert to_server(out)[0]["error"]["code"] == -32600
    assert records(out)[0]["event"] == "reject"


def test_a_server_cancel_withdraws_its_request_from_the_table() -> None:
    wire = policy_wire()
    wire.server(SAMPLING)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "s1"}}
    assert to_client(wire.server(cancel)) == [cancel]
    assert records(wire.client(result("s1")))[0]["event"] == "reject"


def test_a_server_cancel_of_a_visor_id_is_dropped() -> None:
    wire = policy_wire()
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "visor-1"}}
    assert wire.server(cancel) == []


def test_visors_own_request_to_the_client_is_answered_to_visor_never_to_the_server() -> None:
    wire = policy_wire()
    out = wire.feed(VisorRequest("visor-abc", "elicitation/create", {"mode": "form"}))
    assert to_client(out) == [request("visor-abc", "elicitation/create", {"mode": "form"})]
    reply = wire.client(result("visor-abc", {"action": "decline"}))
    assert to_server(reply) == []
    assert reply == [DeliverReply("visor-abc", result("visor-abc", {"action": "decline"}))]


def test_an_answer_to_a_forgotten_visor_request_is_recorded_and_dropped() -> None:
    wire = policy_wire()
    wire.feed(VisorRequest("visor-abc", "elicitation/create", {}))
    wire.feed(VisorForget("visor-abc"))
    out = wire.client(result("visor-abc"))
    assert to_server(out) == []
    assert records(out)[0]["reason"] == "response to no request Visor sent"


def test_visors_request_when_the_client_is_gone_fails_at_once() -> None:
    wire = policy_wire()
    wire.client(b"")
    from visor.core.events import ClientEof

    wire.feed(ClientEof())
    out = wire.feed(VisorRequest("visor-abc", "elicitation/create", {}))
    assert out == [DeliverReply("visor-abc", {"error": {"code": -32603, "message": "the client is gone"}})]


def test_a_refused_line_is_answered_and_recorded_by_size_and_digest_never_its_bytes() -> None:
    wire = policy_wire()
    raw = b'{"jsonrpc":"2.0","id":1,"method":"ping","id":2}'
    out = wire.feed(ClientData(raw + b"\n"))
    assert to_server(out) == []
    rec = records(out)[0]
    assert rec["event"] == "reject" and rec["bytes"] == len(raw)
    assert rec["sha256"] == hashlib.sha256(raw).hexdigest()
    assert raw not in line(rec)


def test_the_tools_list_answer_pins_the_tools() -> None:
    wire = policy_wire(listed=False)
    wire.client(request("l", "tools/list"))
    out = wire.server(result("l", {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}))
    assert [(r["event"], r.get("tool")) for r in records(out)] == [("pin", "echo")]
    assert to_client(out)[0]["id"] == "l"


def test_a_server_request_the_policy_refuses_is_answered_to_the_server_and_never_seen_by_the_client() -> None:
    wire = policy_wire(
        policy="""\
        version: "1.0"
        default_action: deny
        servers:
          - name: "srv"
            allowed: true
            server_requests:
              sampling: deny
            tools:
              - name: "echo"
                allowed: true
        """
    )
    out = wire.server(SAMPLING)
    assert to_client(out) == []
    (refusal,) = to_server(out)
    assert refusal["id"] == "s1" and refusal["error"]["code"] == -32600
    assert [(r["event"], r["rule"]) for r in records(out)] == [
        ("deny", "servers[srv].server_requests.sampling")
    ]
    assert "s1" not in wire.core.server_pending
