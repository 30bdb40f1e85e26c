"""`visor serve` as a real subprocess on a free port, and small raw-HTTP helpers for the tests."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SDK_SERVER = ROOT / "tests" / "servers" / "sdk_server.py"
HTTP_SDK_SERVER = ROOT / "tests" / "http" / "http_sdk_server.py"
# tests/servers/mailbox.py, and a policy for it: a budget of three pings, a send whose address
# must not come from the inbox (the shared-state and 2026-07-28 tests).
MAILBOX = ROOT / "tests" / "servers" / "mailbox.py"
MAIL_POLICY = """
version: "1.0"
default_action: deny
servers:
  - name: "mail"
    allowed: true
    tools:
      - name: read_inbox
        allowed: true
      - name: send_email
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
      - name: ping
        allowed: true
        max_calls: 3
"""
READY = "visor serve: listening on "

ACCEPT_BOTH = "application/json, text/event-stream"
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "visor-serve-test", "version": "0"},
    },
}


def stdio_upstream(pid_file: Path) -> list[str]:
    """The SDK test server, behind a shell that records its pid (exec keeps the pid)."""
    return ["sh", "-c", f'echo $$ >> "{pid_file}"; exec "{sys.executable}" "{SDK_SERVER}"']


@dataclass
class Serve:
    proc: subprocess.Popen[str]
    url: str
    audit: Path
    lines: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.url.removesuffix("/mcp")

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_bytes().splitlines()]

    def stderr(self) -> str:
        return "".join(self.lines)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state says it is gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False


@contextlib.contextmanager
def serve(
    tmp_path: Path,
    upstream: list[str] | None = None,
    *options: str,
    policy: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Serve]:
    audit = tmp_path / "audit" / "serve.jsonl"
    args = [sys.executable, "-m", "visor.cli", "serve", "--listen", "127.0.0.1:0", "--audit-log", str(audit)]
    if policy is not None:
        policy_file = tmp_path / "policy.yaml"
        policy_file.write_text(policy)
        args += ["--policy", str(policy_file)]
    args += list(options)
    if upstream is not None:
        args += ["--", *upstream]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "VISOR_HOME": str(tmp_path / "home"), **(env or {})},
    )
    lines: list[str] = []
    ready: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(READY):
                ready.put(line)
        ready.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        first = ready.get(timeout=60)
        if first is None:
            raise AssertionError("visor serve exited before it listened:\n" + "".join(lines))
        yield Serve(proc, first[len(READY) :].strip(), audit, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
    """One raw HTTP exchange (the rules are about exact statuses and headers, not a client's view)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, parts.path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def post(url: str, message: Any, session: str | None = None, **headers: str) -> Reply:
    base = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH}
    if session is not None:
        base["Mcp-Session-Id"] = session
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return http("POST", url, body, {**base, **headers})


def initialize(url: str, **headers: str) -> str:
    reply = post(url, INIT, **headers)
    assert reply.status == 200, reply
    assert "result" in reply.json(), reply
    sid = reply.headers["mcp-session-id"]
    assert post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid, **headers).status == 202
    return sid
