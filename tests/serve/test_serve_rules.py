"""The transport's rules at `visor serve`'s door: statuses, JSON-RPC error bodies, hardening, session end."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.serve.serve_proc import ACCEPT_BOTH, INIT, alive, http, initialize, post, serve, stdio_upstream

TOKEN = "t0ken-of-the-test-0123456789abcdef"


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def test_healthz_answers_200(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        reply = http("GET", gw.base + "/healthz")
        assert reply.status == 200 and reply.body == b"ok\n"


def test_bad_requests_get_the_specified_status_and_a_json_rpc_error(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids"), "--max-message-bytes", "65536") as gw:
        sid = initialize(gw.url)
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}

        def refused(reply: object, status: int, code: int) -> dict:
            assert reply.status == status, reply  # type: ignore[attr-defined]
            body = reply.json()  # type: ignore[attr-defined]
            assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, body
            return body

        refused(post(gw.url, call, sid, **{"Content-Type": "text/plain"}), 415, -32600)
        refused(post(gw.url, call, sid, Accept="application/json"), 406, -32600)
        refused(post(gw.url, call, sid, Accept="text/event-stream"), 406, -32600)
        refused(post(gw.url, [call], sid), 400, -32600)  # a batch
        refused(post(gw.url, b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}', sid), 400, -32600)
        refused(post(gw.url, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"', sid), 400, -32700)
        refused(post(gw.url, {"jsonrpc": "2.0", "id": {"no": 1}, "method": "tools/list"}, sid), 400, -32600)
        refused(post(gw.url, call), 400, -32600)  # no session id
        refused(post(gw.url, call, "0" * 32), 404, -32600)  # unknown session id
        refused(post(gw.url, call, sid, **{"MCP-Protocol-Version": "1999-01-01"}), 400, -32600)
        refused(http("PUT", gw.url, b"{}"), 405, -32600)
        refused(http("GET", gw.url, None, {"Accept": "application/json", "Mcp-Session-Id": sid}), 406, -32600)
        big = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"' + b"a" * 70_000 + b'"}}'
        refused(post(gw.url, big, sid), 413, -32600)
        # The session still works after all that, and each refused body it owned is one audit record.
        listed = post(gw.url, call, sid)
        assert listed.status == 200 and "tools" in listed.json()["result"]
        rejects = [r for r in gw.records() if r["event"] == "reject" and r.get("mcp_session") == sid]
        assert len(rejects) == 4 and all(len(r["sha256"]) == 64 for r in rejects)


def test_origin_or_host_of_another_site_is_refused(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        refused = post(gw.url, INIT, Origin="http://evil.example")
        assert refused.status == 403 and refused.json()["error"]["code"] == -32600
        assert not (tmp_path / "pids").exists()  # no session, no upstream started
        port = gw.url.split(":")[2].split("/")[0]
        # The listen host's own origin (any loopback spelling) is the same machine.
        assert post(gw.url, INIT, Origin=f"http://localhost:{port}").status == 200
        assert post(gw.url, INIT, Origin=f"http://127.0.0.1:{port}").status == 200
        # A rebound name reaching a loopback listener is refused even without an Origin.
        rebound = post(gw.url, INIT, Host=f"attacker.example:{port}")
        assert rebound.status == 403 and rebound.json()["error"]["code"] == -32600
        assert post(gw.url, INIT, Host=f"localhost:{port}").status == 200
        # Spellings a lenient URL parser reads as loopback, and no browser sends, are refused.
        assert post(gw.url, INIT, Host=f"evil.example\\@127.0.0.1:{port}").status == 403
        assert post(gw.url, INIT, Origin=f"http://evil.example\\@localhost:{port}").status == 403
        assert post(gw.url, INIT, Origin=f"http://localhost:{port}/path").status == 403


def test_a_non_loopback_listen_without_a_client_token_is_refused_at_start(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "visor.cli", "serve", "--listen", "0.0.0.0:0", "--", "true"],
        capture_output=True, text=True, timeout=60, env={"VISOR_HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 2
    assert "without client authentication" in proc.stderr and "--client-token-env" in proc.stderr


def test_a_client_token_is_required_when_set(tmp_path: Path) -> None:
    with serve(
        tmp_path,
        stdio_upstream(tmp_path / "pids"),
        "--client-token-env",
        "SERVE_TOKEN",
        env={"SERVE_TOKEN": TOKEN},
    ) as gw:
        missing = post(gw.url, INIT)
        assert missing.status == 401 and missing.headers["www-authenticate"].startswith("Bearer")
        assert post(gw.url, INIT, Authorization=f"Bearer {TOKEN}x").status == 401
        assert post(gw.url, INIT, Authorization=TOKEN).status == 401
        assert not (tmp_path / "pids").exists()
        sid = initialize(gw.url, Authorization=f"Bearer {TOKEN}")
        listed = post(
            gw.url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid, Authorization=f"Bearer {TOKEN}"
        )
        assert listed.status == 200
        assert post(gw.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid).status == 401


def test_delete_ends_the_session_and_its_upstream_process(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with serve(tmp_path, stdio_upstream(pids)) as gw:
        sid = initialize(gw.url)
        [pid] = _pids(pids)
        assert alive(pid)
        assert http("DELETE", gw.url, None, {"Mcp-Session-Id": sid}).status == 200
        # DELETE answers once the upstream process has been stopped and reaped.
        assert not alive(pid)
        gone = post(gw.url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid)
        assert gone.status == 404
        assert http("DELETE", gw.url, None, {"Mcp-Session-Id": sid}).status == 404
        assert any(r["event"] == "session_end" and r["mcp_session"] == sid for r in gw.records())


def test_an_idle_session_expires_and_its_upstream_process_ends(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with serve(tmp_path, stdio_upstream(pids), "--idle-timeout", "0.5") as gw:
        sid = initialize(gw.url)
        [pid] = _pids(pids)
        deadline = time.monotonic() + 60
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid)
        assert post(gw.url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid).status == 404
        assert "session_idle_expired" in gw.stderr()


def test_the_session_cap_refuses_one_more_initialize(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids"), "--max-sessions", "1") as gw:
        initialize(gw.url)
        full = post(gw.url, INIT)
        assert full.status == 503 and full.json()["error"]["code"] == -32603


def test_a_sessionless_2026_07_28_request_without_its_envelope_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    # (Requests that carry it are served: tests/serve/test_serve_modern.py.)
    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        refused = post(gw.url, call, **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"})
        assert refused.status == 400 and refused.json()["id"] == 1
        error = refused.json()["error"]
        assert error["code"] == -32602 and "io.modelcontextprotocol/protocolVersion" in error["message"]


def test_the_in_flight_cap_refuses_one_more_request_with_429(tmp_path: Path) -> None:
    import json
    from http.client import HTTPConnection
    from urllib.parse import urlsplit

    policy = 'version: "1.0"\ndefault_action: allow\n'
    with serve(tmp_path, stdio_upstream(tmp_path / "pids"), "--max-in-flight", "1", policy=policy) as gw:
        sid = initialize(gw.url)
        parts = urlsplit(gw.url)
        held = HTTPConnection(parts.hostname, parts.port, timeout=30)
        call = {"jsonrpc": "2.0", "id": "held", "method": "tools/call",
                "params": {"name": "confirm", "arguments": {"question": "go?"}}}  # fmt: skip
        headers = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH, "Mcp-Session-Id": sid}
        held.request("POST", parts.path, json.dumps(call).encode(), headers)
        # The tool waits for the client's answer to its elicitation, sent first on this POST's stream.
        stream = held.getresponse()
        assert stream.status == 200 and stream.getheader("Content-Type") == "text/event-stream"
        assert b"elicitation/create" in b"".join(stream.readline() for _ in range(3))
        over = post(gw.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
        assert over.status == 429 and over.json()["error"]["code"] == -32600
        held.close()


def test_one_get_stream_per_session_and_a_closed_one_can_be_reopened(tmp_path: Path) -> None:
    from http.client import HTTPConnection
    from urllib.parse import urlsplit

    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        sid = initialize(gw.url)
        parts = urlsplit(gw.url)
        headers = {"Accept": "text/event-stream", "Mcp-Session-Id": sid}
        first = HTTPConnection(parts.hostname, parts.port, timeout=30)
        first.request("GET", parts.path, headers=headers)
        stream = first.getresponse()
        assert stream.status == 200 and stream.getheader("Content-Type") == "text/event-stream"
        second = http("GET", gw.url, None, headers)
        assert second.status == 409 and second.json()["error"]["code"] == -32600
        first.close()
        # The gateway notices the client went away and closes its end; then a GET opens again.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            again = HTTPConnection(parts.hostname, parts.port, timeout=30)
            again.request("GET", parts.path, headers=headers)
            status = again.getresponse().status
            again.close()
            if status != 409:
                break
            time.sleep(0.1)
        assert status == 200


def test_an_upstream_that_cannot_start_fails_initialize_and_the_gateway_stays_up(tmp_path: Path) -> None:
    with serve(tmp_path, [str(tmp_path / "no-such-server")]) as gw:
        for _ in range(2):
            failed = post(gw.url, INIT)
            assert failed.status in (500, 502) and failed.json()["error"]["code"] == -32603
            assert "mcp-session-id" not in failed.headers
        assert http("GET", gw.base + "/healthz").status == 200
        assert gw.proc.poll() is None


def test_bad_options_are_refused_at_start_with_the_reason(tmp_path: Path) -> None:
    def start(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "visor.cli", "serve", *options],
            capture_output=True, text=True, timeout=60,
            env={"VISOR_HOME": str(tmp_path / "home"), "SHORT": "abc"},
        )  # fmt: skip

    cases = [
        (["--listen", "nonsense", "--", "true"], "expected HOST:PORT"),
        (["--client-token-env", "UNSET_VAR", "--", "true"], "is not set or empty"),
        (["--client-token-env", "SHORT", "--", "true"], "at least 16 characters"),
        (["--idle-timeout", "0", "--", "true"], "--idle-timeout"),
        ([], "no server command given"),
        (["--url", "http://127.0.0.1:1/mcp", "--", "true"], "not both"),
    ]
    for options, reason in cases:
        proc = start(*options)
        assert proc.returncode == 2 and reason in proc.stderr, (options, proc.stderr)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    proc = start("--audit-log", str(tmp_path / "a.jsonl"), "--approval-dir", str(blocker), "--", "true")
    assert proc.returncode == 1 and "approval directory refused" in proc.stderr, proc.stderr


def test_a_routing_or_identifying_header_given_twice_is_refused(tmp_path: Path) -> None:
    import http.client
    import json
    from urllib.parse import urlsplit

    pids = tmp_path / "pids"
    with serve(tmp_path, stdio_upstream(pids)) as gw:
        sid = initialize(gw.url)
        parts = urlsplit(gw.url)
        body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).encode()
        for name, values in [
            ("Mcp-Session-Id", [sid, "another"]),
            ("Mcp-Session-Id", [sid, sid]),
            ("Authorization", ["Bearer a", "Bearer b"]),
            ("MCP-Protocol-Version", ["2025-11-25", "2025-11-25"]),
            ("Origin", [f"http://{parts.hostname}:{parts.port}", "https://evil.example"]),
        ]:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            try:
                conn.putrequest("POST", parts.path)
                conn.putheader("Content-Type", "application/json")
                conn.putheader("Accept", "application/json, text/event-stream")
                conn.putheader("Content-Length", str(len(body)))
                if name != "Mcp-Session-Id":
                    conn.putheader("Mcp-Session-Id", sid)
                for value in values:
                    conn.putheader(name, value)
                conn.endheaders(body)
                reply = conn.getresponse()
                answer = json.loads(reply.read())
            finally:
                conn.close()
            assert reply.status == 400, (name, reply.status, answer)
            assert "more than once" in answer["error"]["message"]
        # Once each, the same request is served.
        assert post(gw.url, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, sid).status == 200


def test_every_body_the_relay_would_refuse_is_answered_at_the_door(tmp_path: Path) -> None:
    # The gateway reads a client's body with the relay's client-side strictness: a body it let in
    # and the relay then refused (keys equal after case folding, an integer past 64 bits) was
    # never answered, and on the sessionless path it was re-serialised with the number changed.
    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        sid = initialize(gw.url)
        nested = b"[" * 900 + b"]" * 900
        variants = [
            b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":'
            b'{"text":"a","Text":"b","deep":' + nested + b"}}}",
            b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":'
            b'{"text":"a","n":123456789012345678901234567890}}}',
        ]
        for body in variants:
            reply = post(gw.url, body, sid)
            assert reply.status == 400 and reply.json()["error"]["code"] == -32600, reply
        modern = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
        meta = b'"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}'
        big = (
            b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"a","n":123456789012345678901234567890},' + meta + b"}}"
        )
        reply = post(gw.url, big, **modern)
        assert reply.status == 400 and "64-bit" in reply.json()["error"]["message"], reply


def test_a_body_for_no_session_is_not_read(tmp_path: Path) -> None:
    # The session is looked up before the body is read: a client that announces 16 MB for a
    # session that does not exist is answered 404 without sending any of it.
    import http.client
    from urllib.parse import urlsplit

    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        parts = urlsplit(gw.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.putrequest("POST", parts.path)
        for name, value in {
            "Content-Type": "application/json", "Accept": ACCEPT_BOTH, "Mcp-Session-Id": "0" * 32,
            "Content-Length": str(16 * 1024 * 1024 - 1),
        }.items():  # fmt: skip
            conn.putheader(name, value)
        conn.endheaders()
        reply = conn.getresponse()
        assert reply.status == 404
        conn.close()


def test_a_last_event_id_of_other_digits_opens_a_plain_stream(tmp_path: Path) -> None:
    # "²" is a digit to str.isdigit and not to int(): it was a 500.
    import http.client
    from urllib.parse import urlsplit

    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        sid = initialize(gw.url)
        parts = urlsplit(gw.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", parts.path, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                                 "Last-Event-ID": "\u00b2.1".encode().decode("latin-1")})  # fmt: skip
        reply = conn.getresponse()
        assert reply.status == 200 and reply.getheader("Content-Type") == "text/event-stream"
        conn.close()
