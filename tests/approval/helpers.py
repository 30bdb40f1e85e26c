"""Start `visor run` with approvals configured, and read what it leaves behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import VisorProcess

SERVER = Path(__file__).parents[1] / "servers" / "approval.py"

POLICY = """\
version: "1.0"
default_action: deny
settings:
  approval_timeout_seconds: {timeout}
servers:
  - name: "rec"
    allowed: true
    tools:
      - name: "echo"
        allowed: true
        approval_required: {echo_approval}
      - name: "collide"
        allowed: true
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
        trusted_destinations: ["boss@example.com"]
"""


def write_policy(tmp_path: Path, timeout: int = 60, echo_approval: bool = False) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(timeout=timeout, echo_approval=str(echo_approval).lower()))
    return path


def start(
    tmp_path: Path,
    *,
    timeout: int = 60,
    echo_approval: bool = False,
    approval_dir: Path | None = None,
    extra: list[str] | None = None,
) -> tuple[VisorProcess, Path, Path]:
    """A raw-pipe client (no elicitation) behind `visor run`; tools already listed."""
    policy = write_policy(tmp_path, timeout, echo_approval)
    log = tmp_path / "received.jsonl"
    audit = tmp_path / "audit.jsonl"
    args = ["--server-name", "rec", "--policy", str(policy), "--audit-log", str(audit)]
    if approval_dir is not None:
        args += ["--approval-dir", str(approval_dir)]
    vp = VisorProcess(
        [sys.executable, str(SERVER)],
        env={"APPROVAL_SERVER_LOG": str(log), "APPROVAL_SERVER_AUDIT": str(audit)},
        visor_args=args + (extra or []),
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    log.write_bytes(b"")
    return vp, log, audit


def call(vp: VisorProcess, msg_id: object, tool: str, arguments: dict, meta: dict | None = None) -> None:
    params: dict = {"name": tool, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    vp.request({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})


def pending(approval_dir: Path) -> dict[str, dict]:
    out = {}
    for p in approval_dir.glob("*.pending"):
        try:
            out[p.stem] = json.loads(p.read_bytes())
        except (OSError, ValueError):
            continue  # being replaced or removed right now
    return out


def wait_pending(approval_dir: Path, count: int = 1, timeout: float = 20.0) -> dict[str, dict]:
    """Wait for `count` pending requests to exist (an event, not a speed assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pending(approval_dir)
        if len(found) >= count:
            return found
        time.sleep(0.02)
    raise AssertionError(
        f"expected {count} pending request(s) in {approval_dir}, found {pending(approval_dir)}"
    )


def wait_gone(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not path.exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} was not removed")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "visor.cli", *args], capture_output=True, text=True, timeout=30, env=env
    )


def records(audit: Path) -> list[dict]:
    return [json.loads(line) for line in audit.read_bytes().splitlines()]


def events_for(audit: Path, msg_id: object) -> list[str]:
    return [r["event"] for r in records(audit) if r.get("id") == msg_id and r["event"] != "result"]


def recv_id(vp: VisorProcess, msg_id: object, timeout: float = 20.0) -> dict:
    """The response to `msg_id`; anything else that arrives first must be a notification."""
    while True:
        msg = vp.recv(timeout)
        if msg.get("id") == msg_id and "method" not in msg:
            return msg
        assert "id" not in msg or "method" in msg, msg


def text(resp: dict) -> str:
    return resp["result"]["content"][0]["text"]
