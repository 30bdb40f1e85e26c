"""The transport's rules at `visor serve`'s door: statuses, JSON-RPC error bodies, hardening, session end."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.serve.serve_proc import INIT, alive, http, initialize, post, serve, stdio_upstream

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


def test_origin_of_another_site_is_refused(tmp_path: Path) -> None:
    with serve(tmp_path, stdio_upstream(tmp_path / "pids")) as gw:
        refused = post(gw.url, INIT, Origin="http://evil.example")
        assert refused.status == 403 and refused.json()["error"]["code"] == -32600
        assert not (tmp_path / "pids").exists()  # no session, no upstream started
        port = gw.url.split(":")[2].split("/")[0]
        # The listen host's own origin (any loopback spelling) is the same machine.
        assert post(gw.url, INIT, Origin=f"http://localhost:{port}").status == 200
        assert post(gw.url, INIT, Origin=f"http://127.0.0.1:{port}").status == 200


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
