"""A tools/call that comes before any tools/list: Visor lists the tools itself.

Clients that cache a listing, or call a tool they know, call before listing
(the MCP conformance suite does). Through a real `visor run` with the
embedded default policy: Visor sends its own tools/list (reserved id, every
page), consumes the answer, pins it as the first listing, then judges the
call; no answer or an error denies the call; the client never sees Visor's
listing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import TESTS, VisorProcess

LISTER = TESTS / "servers" / "late_lister.py"
INIT = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


def _start(tmp_path: Path, mode: str = "ok", timeout: str = "20") -> tuple[VisorProcess, Path, Path]:
    log, audit = tmp_path / "received.jsonl", tmp_path / "audit.jsonl"
    vp = VisorProcess(
        [sys.executable, str(LISTER)],
        env={"LISTER_LOG": str(log), "LISTER_MODE": mode, "VISOR_TOOLS_LIST_TIMEOUT": timeout},
        visor_args=["--audit-log", str(audit), "--server-name", "lister"],
    )
    vp.request(INIT)
    assert vp.recv()["id"] == "init"
    vp.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return vp, log, audit


def _call(msg_id: object, tool: str = "echo", **arguments: object) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def _received(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_bytes().splitlines() if line.strip()]


def _records(audit: Path) -> list[dict]:
    return [json.loads(line) for line in audit.read_bytes().splitlines()]


def _finish(vp: VisorProcess) -> list[bytes]:
    """Close the session; every byte Visor wrote to the client after that point."""
    vp.close_stdin()
    rest = vp.remaining_output()
    assert vp.wait() == 0, vp.stderr
    return rest


def test_a_call_before_any_listing_gets_the_real_result_and_the_server_saw_visors_listing_first(
    tmp_path: Path,
) -> None:
    vp, log, audit = _start(tmp_path)
    vp.request(_call(1, text="hi"))
    vp.request({"jsonrpc": "2.0", "id": 2, "method": "ping"})  # after the call: held behind it
    raw = [vp.recv_raw(), vp.recv_raw()]
    rest = _finish(vp)
    answers = [json.loads(line) for line in raw]
    assert [a["id"] for a in answers] == [1, 2]
    assert json.loads(answers[0]["result"]["content"][0]["text"]) == {
        "tool": "echo",
        "arguments": {"text": "hi"},
    }
    # The client's bytes: its own two answers and nothing else (no Visor listing).
    assert rest == []
    assert not any(b"visor-" in line or b"second_page" in line for line in raw)

    seen = _received(log)
    methods = [m.get("method") for m in seen]
    assert methods == ["initialize", "notifications/initialized", "tools/list", "tools/call", "ping"]
    listing = seen[2]
    assert isinstance(listing["id"], str) and listing["id"].startswith("visor-")
    assert len(listing["id"]) == len("visor-") + 32

    recs = _records(audit)
    pins = [r["tool"] for r in recs if r["event"] == "pin" and "tool" in r]
    assert pins == ["echo", "second_page"]
    assert not any(r.get("late") for r in recs)
    allow = [r for r in recs if r["event"] == "allow"]
    assert [(r["tool"], r["id"]) for r in allow] == [("echo", 1)]
    assert recs.index(next(r for r in recs if r["event"] == "pin")) < recs.index(allow[0])


def test_a_tool_missing_from_visors_listing_is_an_unknown_tool(tmp_path: Path) -> None:
    vp, log, audit = _start(tmp_path)
    vp.request(_call(7, tool="not_listed"))
    answer = vp.recv()
    _finish(vp)
    assert answer["id"] == 7 and answer["result"]["isError"] is True
    assert "pin.unknown_tool" in answer["result"]["content"][0]["text"]
    assert [m.get("method") for m in _received(log)][2:] == ["tools/list"]  # the call never reached it
    denies = [r for r in _records(audit) if r["event"] == "deny"]
    assert [(r["rule"], r["id"]) for r in denies] == [("pin.unknown_tool", 7)]


def test_every_page_is_fetched_following_next_cursor(tmp_path: Path) -> None:
    vp, log, audit = _start(tmp_path, mode="paged")
    vp.request(_call("a", tool="second_page", n=1))
    answer = vp.recv()
    _finish(vp)
    assert json.loads(answer["result"]["content"][0]["text"])["tool"] == "second_page"
    lists = [m for m in _received(log) if m.get("method") == "tools/list"]
    assert [(m["params"].get("cursor")) for m in lists] == [None, "page-2"]
    assert all(m["id"].startswith("visor-") for m in lists) and lists[0]["id"] != lists[1]["id"]
    pins = [r["tool"] for r in _records(audit) if r["event"] == "pin" and "tool" in r]
    assert pins == ["echo", "second_page"]


def test_the_clients_own_later_listing_is_relayed_as_usual(tmp_path: Path) -> None:
    vp, log, audit = _start(tmp_path)
    vp.request(_call(1))
    vp.request({"jsonrpc": "2.0", "id": "mine", "method": "tools/list"})
    first, second = vp.recv(), vp.recv()
    _finish(vp)
    assert first["id"] == 1 and "isError" not in first["result"]
    assert second["id"] == "mine"
    assert [t["name"] for t in second["result"]["tools"]] == ["echo", "second_page"]
    ids = [m["id"] for m in _received(log) if m.get("method") == "tools/list"]
    assert ids[0].startswith("visor-") and ids[1] == "mine"
    # The client's listing matched the pins: nothing late, nothing changed.
    assert not [r for r in _records(audit) if r["event"] in ("pin_changed",) or r.get("late")]


def test_a_server_that_never_answers_the_listing_gets_no_call(tmp_path: Path) -> None:
    vp, log, audit = _start(tmp_path, mode="silent", timeout="1")
    vp.request(_call(1, text="x"))
    vp.request({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    answer = vp.recv(timeout=30)
    after = vp.recv(timeout=30)
    _finish(vp)
    assert answer["id"] == 1 and answer["result"]["isError"] is True
    text = answer["result"]["content"][0]["text"]
    assert "pin.no_tools_list" in text and "no answer within 1 seconds" in text
    assert after["id"] == 2  # later messages were held, then relayed
    methods = [m.get("method") for m in _received(log)]
    assert "tools/call" not in methods and methods[-1] == "ping"
    denies = [r for r in _records(audit) if r["event"] == "deny"]
    assert [(r["rule"], r["id"], r["tool"]) for r in denies] == [("pin.no_tools_list", 1, "echo")]
    assert not [r for r in _records(audit) if r["event"] == "allow"]


def test_a_listing_answered_with_an_error_denies_the_call(tmp_path: Path) -> None:
    vp, log, audit = _start(tmp_path, mode="error")
    vp.request(_call(1))
    vp.request(_call(2))  # waits for the same attempt... or the next one; denied either way
    answers = {vp.recv()["id"]: None, vp.recv()["id"]: None}
    rest = _finish(vp)
    assert set(answers) == {1, 2}
    assert not any(b"listing is broken" in line or b"visor-" in line for line in rest)
    assert "tools/call" not in [m.get("method") for m in _received(log)]
    denies = [r for r in _records(audit) if r["event"] == "deny"]
    assert sorted(r["id"] for r in denies) == [1, 2]
    assert {r["rule"] for r in denies} == {"pin.no_tools_list"}
    assert all("error -32603" in r["reason"] for r in denies)


def test_calls_waiting_for_the_listing_keep_their_order(tmp_path: Path) -> None:
    vp, log, _audit = _start(tmp_path)
    for i in range(5):
        vp.request(_call(i, i=i))
    got = [vp.recv()["id"] for _ in range(5)]
    _finish(vp)
    assert sorted(got) == list(range(5))
    calls = [m["id"] for m in _received(log) if m.get("method") == "tools/call"]
    assert calls == list(range(5))
    assert [m.get("method") for m in _received(log)].count("tools/list") == 1
