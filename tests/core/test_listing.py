"""A call before any listing: Visor's own tools/list, paged, timed, failing, cancelled, never seen by the client."""

from __future__ import annotations

from tests.core.fake_wire import (
    TOOLS,
    call,
    cancel,
    commits,
    policy_wire,
    records,
    request,
    result,
    to_client,
    to_server,
)
from visor.core.events import CancelTimer, ServerEof, StartTimer, TimerFired

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "progressToken": 5}


def test_visor_lists_the_tools_first_and_its_answer_never_reaches_the_client() -> None:
    wire = policy_wire(listed=False)
    out = wire.client(call(1, "echo"), request(2, "ping"))
    (listing,) = to_server(out)  # ahead of the held call; the ping waits behind the call
    assert listing == request("visor-" + "0" * 31 + "1", "tools/list", {})
    (timer,) = [a for a in out if isinstance(a, StartTimer)]
    assert timer.seconds == 15.0
    answered = wire.server(result(listing["id"], {"tools": TOOLS}))
    assert to_client(answered) == []
    assert [r["event"] for r in records(answered)] == ["pin", "pin", "pin", "allow"]
    assert CancelTimer(timer.timer) in answered
    assert [m["id"] for m in to_server(wire.commit_all(answered))] == [1, 2]


def test_the_listing_carries_the_calls_protocol_meta_and_follows_every_page() -> None:
    wire = policy_wire(listed=False)
    params = {"name": "echo", "arguments": {}, "_meta": META}
    (first,) = to_server(wire.client(request(1, "tools/call", params)))
    assert first["params"] == {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    page = wire.server(result(first["id"], {"tools": TOOLS[:1], "nextCursor": "p2"}))
    (second,) = to_server(page)
    assert second["params"]["cursor"] == "p2" and second["id"] != first["id"]
    done = wire.server(result(second["id"], {"tools": TOOLS[1:]}))
    assert [c.event["id"] for c in commits(done)] == [1]


def test_calls_that_come_meanwhile_wait_for_the_same_listing_and_are_judged_in_order() -> None:
    wire = policy_wire(listed=False)
    (listing,) = to_server(wire.client(call(1, "echo")))
    assert to_server(wire.client(call(2, "rm"), call(3, "echo"))) == []
    out = wire.server(result(listing["id"], {"tools": TOOLS}))
    assert [(r["event"], r["id"]) for r in records(out) if r["event"] != "pin"] == [
        ("allow", 1),
        ("deny", 2),
        ("allow", 3),
    ]
    assert [m["id"] for m in to_client(out)] == [2]


def test_a_tool_the_server_did_not_list_is_unknown() -> None:
    wire = policy_wire(listed=False)
    (listing,) = to_server(wire.client(call(1, "ghost")))
    out = wire.server(result(listing["id"], {"tools": TOOLS}))
    assert records(out)[-1]["rule"] == "pin.unknown_tool"


def test_no_answer_in_time_denies_the_call_and_a_late_answer_is_recorded_and_dropped() -> None:
    wire = policy_wire(listed=False, listing_timeout=2.5)
    out = wire.client(call(1, "echo"), request(2, "ping"))
    (listing,) = to_server(out)
    (timer,) = [a for a in out if isinstance(a, StartTimer)]
    fired = wire.feed(TimerFired(timer.timer))
    (deny,) = records(fired)
    assert deny["rule"] == "pin.no_tools_list" and "no answer within 2.5 seconds" in deny["reason"]
    assert to_server(fired) == [request(2, "ping")]
    assert to_client(fired)[0]["result"]["isError"] is True
    late = wire.server(result(listing["id"], {"tools": TOOLS}))
    assert [(r["event"], r["reason"]) for r in records(late)] == [
        ("reject", "response to no request the client sent")
    ]
    # the next call tries again
    assert to_server(wire.client(call(3, "echo")))[0]["method"] == "tools/list"


def test_an_error_answer_denies_with_its_code() -> None:
    wire = policy_wire(listed=False)
    (listing,) = to_server(wire.client(call(1, "echo")))
    out = wire.server({"jsonrpc": "2.0", "id": listing["id"], "error": {"code": -32601, "message": "no"}})
    assert "the server answered with error -32601" in records(out)[0]["reason"]


def test_the_server_closing_denies_the_waiting_call() -> None:
    wire = policy_wire(listed=False)
    wire.client(call(1, "echo"))
    out = wire.feed(ServerEof())
    assert "the server answered with error -32603" in records(out)[0]["reason"]


def test_a_call_cancelled_while_visor_lists_is_recorded_and_releases_what_waited() -> None:
    wire = policy_wire(listed=False)
    (listing,) = to_server(wire.client(call(1, "echo"), request(2, "ping")))
    out = wire.client(cancel(1))
    assert [(r["rule"], r["reason"]) for r in records(out)] == [
        ("pin.cancelled", "the client cancelled the call while Visor fetched the server's tools/list")
    ]
    assert to_server(out) == [request(2, "ping")]
    assert to_client(out) == []
    # the listing still pins; nothing is judged for the withdrawn call
    answered = wire.server(result(listing["id"], {"tools": TOOLS}))
    assert commits(answered) == [] and to_client(answered) == []


def test_the_clients_own_listing_meanwhile_is_relayed_as_usual() -> None:
    wire = policy_wire(listed=False)
    (listing,) = to_server(wire.client(call(1, "echo")))
    wire.client(request("mine", "tools/list"))
    answered = wire.server(result(listing["id"], {"tools": TOOLS}))
    assert [m["id"] for m in to_server(wire.commit_all(answered))] == [1, "mine"]
    back = wire.server(result("mine", {"tools": TOOLS}))
    assert [m["id"] for m in to_client(back)] == ["mine"]


def test_the_session_ending_during_the_listing_denies_the_waiting_call() -> None:
    from visor.core.events import Closing

    wire = policy_wire(listed=False)
    wire.client(call(1, "echo"))
    out = wire.feed(Closing())
    assert [(r["event"], r.get("rule")) for r in records(out)] == [
        ("deny", "pin.no_tools_list"),
        ("session_end", None),
    ]
    assert "the session ended" in records(out)[0]["reason"]
