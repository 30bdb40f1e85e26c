"""tools/call through the core: verdicts, the commit hold, ordering, withdrawal."""

from __future__ import annotations

from tests.core.fake_wire import (
    call,
    cancel,
    commits,
    kinds,
    plain_wire,
    policy_wire,
    records,
    request,
    result,
    to_client,
    to_server,
)
from visor.core.events import ClientEof, CloseServerInput, CommitDone, CommitFailed, SendToServer, StopServer


def test_an_allow_reaches_the_server_only_when_its_record_is_durable() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "echo", text="hi"))
    assert to_server(out) == []
    (commit,) = commits(out)
    assert commit.event["event"] == "allow" and commit.event["tool"] == "echo"
    assert to_server(wire.commit_all(out)) == [call(1, "echo", text="hi")]


def test_messages_after_a_held_call_wait_behind_it_and_keep_their_order() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "echo"), request(2, "ping"), {"jsonrpc": "2.0", "method": "notifications/x"})
    assert to_server(out) == []
    assert wire.core.server_backlog == 3
    released = wire.commit_all(out)
    assert [m.get("id", m.get("method")) for m in to_server(released)] == [1, 2, "notifications/x"]
    assert wire.core.server_backlog == 0


def test_the_other_direction_is_never_held() -> None:
    wire = policy_wire()
    wire.client(call(1, "echo"))
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info"}}
    assert to_client(wire.server(note)) == [note]


def test_a_read_of_pipelined_calls_is_one_batch_of_commits_in_order() -> None:
    wire = policy_wire()
    out = wire.client(*(call(n, "echo", n=n) for n in range(5)))
    assert [c.event["id"] for c in commits(out)] == [0, 1, 2, 3, 4]
    # durable in any grouping: each call goes out in its place once the ones before it are out
    third = commits(out)[2]
    assert to_server(wire.feed(CommitDone(third.call, 7))) == []
    assert [m["id"] for m in to_server(wire.commit_all(commits(out)[:2]))] == [0, 1, 2]


def test_a_deny_is_answered_at_once_and_holds_nothing() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "rm", path="/"), request(2, "ping"))
    assert to_server(out) == [request(2, "ping")]
    (answer,) = to_client(out)
    assert answer["id"] == 1 and answer["result"]["isError"] is True
    assert "Visor denied this call" in answer["result"]["content"][0]["text"]
    assert [r["event"] for r in records(out)] == ["deny"]
    assert 1 not in wire.core.pending


def test_the_result_record_points_at_the_allow_by_seq() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "echo"))
    wire.feed(CommitDone(commits(out)[0].call, 41))
    back = wire.server(result(1, {"content": [{"type": "text", "text": "ok"}]}))
    (rec,) = [r for r in records(back) if r["event"] == "result"]
    assert rec["allow_seq"] == 41 and rec["outcome"] == "ok" and "duration_ms" in rec
    assert to_client(back)[0]["id"] == 1


def test_a_call_cancelled_during_its_commit_never_runs_and_says_so() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "echo"), request(2, "ping"))
    absorbed = wire.client(cancel(1))
    assert to_server(absorbed) == [] and to_client(absorbed) == []
    assert 1 not in wire.core.pending
    done = wire.feed(CommitDone(commits(out)[0].call, 12))
    assert to_server(done) == [request(2, "ping")]  # the later message is released, the call is not
    (rec,) = records(done)
    assert rec == {
        "event": "result",
        "server": "srv",
        "tool": "echo",
        "id": 1,
        "outcome": "cancelled_before_relay",
        "allow_seq": 12,
    }
    assert to_client(done) == []


def test_the_id_of_a_withdrawn_call_may_be_used_again() -> None:
    wire = policy_wire()
    wire.client(call(1, "echo"))
    wire.client(cancel(1))
    out = wire.client(call(1, "echo", again=True))
    assert [c.event["args"] for c in commits(out)] == [{"again": True}]


def test_a_failed_commit_denies_the_call_and_releases_what_waited() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "echo"), request(2, "ping"))
    failed = wire.feed(CommitFailed(commits(out)[0].call, "disk full"))
    assert to_server(failed) == [request(2, "ping")]
    (answer,) = to_client(failed)
    assert answer["result"]["isError"] is True and "disk full" in answer["result"]["content"][0]["text"]


def test_a_cancel_of_a_relayed_request_goes_to_the_server() -> None:
    wire = plain_wire()
    wire.client(request(1, "slow"))
    assert to_server(wire.client(cancel(1))) == [cancel(1)]


def test_a_cancel_naming_nothing_valid_is_absorbed() -> None:
    wire = plain_wire()
    bad = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1]}}
    assert wire.client(bad) == []


def test_without_checks_a_call_goes_straight_through() -> None:
    wire = plain_wire()
    assert to_server(wire.client(call(1, "anything"))) == [call(1, "anything")]
    assert wire.core.pending[1].forwarded


def test_a_resource_read_of_a_sensitive_file_is_refused_and_never_relayed() -> None:
    wire = policy_wire()
    out = wire.client(request(3, "resources/read", {"uri": "file:///home/u/.ssh/id_rsa"}))
    assert to_server(out) == []
    (answer,) = to_client(out)
    assert answer["error"]["code"] == -32602 and answer["error"]["data"]["visor"]["rule"]
    assert [r["event"] for r in records(out)] == ["deny"]
    assert 3 not in wire.core.pending


def test_a_prompt_with_a_secret_in_its_arguments_reaches_the_server_redacted() -> None:
    wire = policy_wire()
    secret = "AKIA" + "ABCDEFGHIJKLMNOP"
    out = wire.client(request(4, "prompts/get", {"name": "p", "arguments": {"key": secret}}))
    (sent,) = to_server(out)
    assert secret not in str(sent) and sent["id"] == 4
    assert [r["event"] for r in records(out)] == ["redact"]


def test_client_eof_stops_the_server_once_everything_accepted_is_sent() -> None:
    wire = policy_wire()
    out = wire.client(call(1, "echo"))
    eof = wire.feed(ClientEof())
    assert kinds(eof) == ["StopServer"]  # the held call is still on its way
    assert [type(a) for a in wire.commit_all(out)] == [SendToServer, CloseServerInput]


def test_client_eof_with_nothing_held_closes_the_servers_input_at_once() -> None:
    wire = plain_wire()
    assert [type(a) for a in wire.feed(ClientEof())] == [StopServer, CloseServerInput]


def test_server_eof_closes_its_input_once_idle_and_stops_nothing_else() -> None:
    from visor.core.events import ServerEof

    wire = policy_wire()
    held = wire.client(call(1, "echo"))
    assert [type(a) for a in wire.feed(ServerEof())] == []  # the held call still has its place
    assert [type(a) for a in wire.commit_all(held)] == [SendToServer, CloseServerInput]


def test_a_client_that_stops_reading_ends_the_session_and_its_later_bytes_are_ignored() -> None:
    from visor.core.events import ClientGone

    wire = plain_wire()
    assert [type(a) for a in wire.feed(ClientGone())] == [StopServer, CloseServerInput]
    assert wire.client(request(1, "ping")) == []
