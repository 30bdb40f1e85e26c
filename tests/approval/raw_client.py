"""A raw-pipe MCP client in front of a real `visor run` that answers every elicitation at once.

It plays the attacker's client: it declares elicitation (in `initialize`, or
only in a call's `_meta`) and accepts every `elicitation/create` the moment it
arrives, so any question Visor lets the client answer is approved within
milliseconds. Tests assert what it was (not) asked and what the directory
decided.
"""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.approval.helpers import SERVER, cli, pending
from tests.conftest import VisorProcess

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
        approval_required: true
{echo_extra}
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
        trusted_destinations: ["boss@example.com"]
"""


class AutoAcceptClient:
    def __init__(
        self,
        tmp_path: Path,
        *,
        visor_args: list[str] = (),  # type: ignore[assignment]
        declare_elicitation: bool = True,
        out_of_band: bool = False,
        timeout: int = 60,
        log_level: str = "info",
    ) -> None:
        policy = tmp_path / "policy.yaml"
        extra = "        approval: out_of_band" if out_of_band else ""
        policy.write_text(POLICY.format(timeout=timeout, echo_extra=extra))
        self.policy = policy
        self.audit = tmp_path / "audit.jsonl"
        self.log = tmp_path / "received.jsonl"
        self.elicited: list[dict[str, Any]] = []
        self.vp = VisorProcess(
            [sys.executable, str(SERVER)],
            visor_args=[
                *("--server-name", "rec", "--policy", str(policy), "--audit-log", str(self.audit)),
                *("--log-level", log_level),
                *visor_args,
            ],
            env={"APPROVAL_SERVER_LOG": str(self.log), "VISOR_HOME": str(tmp_path / "home")},
        )
        caps: dict[str, Any] = {"elicitation": {}} if declare_elicitation else {}
        self.vp.request(
            {
                "jsonrpc": "2.0",
                "id": "init",
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": caps,
                    "clientInfo": {"name": "autoclicker", "version": "1"},
                },
            }
        )
        assert self.wait_response("init")["result"]["serverInfo"]["name"] == "approval-server"
        self.vp.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        assert "tools" in self.wait_response("list")["result"]

    def call(
        self, msg_id: Any, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta is not None:
            params["_meta"] = meta
        self.vp.request({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})

    def wait_response(
        self, msg_id: Any, *, until: Callable[[], bool] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Pump messages, accepting every elicitation instantly, until `msg_id` is answered.

        With `until`, return {} as soon as it is true instead, and fail if
        the response to `msg_id` arrives first.
        """
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no response to {msg_id!r}; stderr: {self.vp.stderr}"
            if until is not None and until():
                return {}
            try:
                msg = self.vp.recv(0.05)
            except queue.Empty:
                continue
            if msg.get("method") == "elicitation/create":
                self.elicited.append(msg)
                self.vp.request(
                    {
                        "jsonrpc": "2.0",
                        "id": msg["id"],
                        "result": {"action": "accept", "content": {"decision": "approve"}},
                    }
                )
                continue
            if msg.get("id") == msg_id and "method" not in msg:
                assert until is None, f"{msg_id!r} was answered before the operator answered: {msg}"
                return msg

    def wait_pending(self, adir: Path, msg_id: Any) -> tuple[str, dict[str, Any]]:
        """The call's pending request, while still answering any elicitation at once."""
        self.wait_response(msg_id, until=lambda: bool(pending(adir)))
        ((pid, rec),) = pending(adir).items()
        return pid, rec

    def close(self) -> None:
        self.vp.close_stdin()
        self.vp.wait()


def answer(adir: Path, verb: str, pid: str) -> None:
    done = cli(verb, "--approval-dir", str(adir), pid)
    assert done.returncode == 0, done.stderr


def text(resp: dict[str, Any]) -> str:
    return resp["result"]["content"][0]["text"]
