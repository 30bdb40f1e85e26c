"""Redaction and gating beyond tools/call, end to end through `visor run` with a raw server."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import VisorProcess, sentinel
from tests.servers.leaky import ANTHROPIC, AWS_ID, GITHUB, PEM

LEAKY = Path(__file__).parents[1] / "servers" / "leaky.py"
BIG_ID = 2**60 + 7  # above 2**53: a double would round it
POLICY = """\
version: "1.0"
default_action: deny
settings:
  max_output_size_bytes: 4000
servers:
  - name: "leaky"
    allowed: true
    hide_denied_tools: true
    server_requests: {sampling: deny}
    resources:
      deny: ["secret://**"]
    prompts:
      deny: ["forbidden-*"]
    tools:
      - {name: echo, allowed: true}
      - {name: leak, allowed: true}
      - {name: strict, allowed: true}
      - {name: utf8, allowed: true}
      - {name: sample, allowed: true}
      - {name: forbidden, allowed: false}
redaction:
  patterns:
    - {name: ticket, regex: "TICKET-[0-9]{4}", replacement: "[ticket]"}
    - {name: ticket-digits, regex: "[0-9]{4}-SECRET", replacement: "[digits]"}
"""
SECRETS = (GITHUB, AWS_ID, "hunter2", "s3cret", ANTHROPIC, "MIIEowIBAAKCAQEA7", "TICKET-1234")


class Env:
    def __init__(self, vp: VisorProcess, log: Path, audit: Path) -> None:
        self.vp, self.log, self.audit = vp, log, audit

    def server_received(self) -> list[dict]:
        return [json.loads(x) for x in self.log.read_bytes().splitlines() if x.strip()]

    def records(self, wait_for: str | None = None) -> list[dict]:
        """The log as written so far. Records that need no fsync are written by
        the audit thread a moment after the answer reaches the client, so a test
        that expects one waits for it (bounded) instead of racing the thread."""
        deadline = time.monotonic() + 5
        while True:
            recs = [json.loads(x) for x in self.audit.read_bytes().splitlines()]
            if wait_for is None or any(r["event"] == wait_for for r in recs) or time.monotonic() > deadline:
                return recs
            time.sleep(0.02)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    log, audit = tmp_path / "received.jsonl", tmp_path / "audit.jsonl"
    vp = VisorProcess(
        [sys.executable, str(LEAKY)],
        env={"LEAKY_LOG": str(log)},
        visor_args=["--server-name", "leaky", "--policy", str(policy), "--audit-log", str(audit)],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    listed = vp.recv()
    assert [t["name"] for t in listed["result"]["tools"]] == ["echo", "leak", "strict", "utf8", "sample"]
    log.write_bytes(b"")
    e = Env(vp, log, audit)
    yield e
    vp.close_stdin()
    vp.wait()
    data = audit.read_bytes()
    for secret in SECRETS:
        assert secret.encode() not in data, f"audit log holds {secret!r}"


def _call(vp: VisorProcess, msg_id: object, tool: str, arguments: dict, meta: dict | None = None) -> bytes:
    params: dict = {"name": tool, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    vp.request({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})
    return vp.recv_raw()


def test_nested_arguments_are_redacted_before_the_server_and_the_log(env: Env) -> None:
    args = {"cfg": {"list": ["fine", f"token {GITHUB}"], "n": 3}, "pem": PEM, "note": "TICKET-1234-SECRET ok"}
    raw = _call(env.vp, BIG_ID, "echo", args, meta={"progressToken": "pt-1"})
    assert f'"id":{BIG_ID}'.encode() in raw  # the id exactly, still an integer
    (got,) = env.server_received()
    assert got["id"] == BIG_ID and got["params"]["_meta"] == {"progressToken": "pt-1"}
    sent = got["params"]["arguments"]
    assert sent["cfg"] == {"list": ["fine", "token [REDACTED:github_token]"], "n": 3}
    assert sent["pem"] == "[REDACTED:private_key]"
    # Overlapping patterns run in order: "ticket" claims TICKET-1234 first, so
    # "ticket-digits" ([0-9]{4}-SECRET) no longer finds its digits.
    assert sent["note"] == "[ticket]-SECRET ok"
    resp = json.loads(raw)
    assert resp["result"]["_meta"]["progressToken"] == "pt-1"
    recs = env.records(wait_for="redact")
    allow = next(r for r in recs if r["event"] == "allow" and r.get("id") == BIG_ID)
    assert allow["args"] == sent
    red = next(r for r in recs if r["event"] == "redact" and r["direction"] == "arguments")
    assert {(f["path"], f["pattern"]) for f in red["fields"]} == {
        ("$.cfg.list[1]", "github_token"),
        ("$.pem", "private_key"),
        ("$.note", "ticket"),
    }


def test_tool_outputs_are_redacted_and_every_other_field_kept(env: Env) -> None:
    raw = _call(env.vp, "leak-1", "leak", {})
    assert b"\n" not in raw.rstrip(b"\n")  # one compact line
    result = json.loads(raw)["result"]
    assert result["content"][0] == {
        "type": "text",
        "text": "key [REDACTED:aws_access_key_id] ok",
        "annotations": {"audience": ["user"]},
    }
    assert result["content"][1]["resource"] == {
        "uri": "memo://k",
        "mimeType": "text/plain",
        "text": "[REDACTED:private_key]",
    }
    assert result["structuredContent"] == {
        "token": "[REDACTED:github_token]",
        "nested": {"list": ["ok", "postgres://app:[REDACTED:password]@db/x"]},
        "n": 5,
    }
    assert result["isError"] is False
    assert result["_meta"]["example.org/n"] == 2**60 + 1
    assert result["futureField"] == {"kept": [1, 2.5, None]}
    red = [r for r in env.records(wait_for="redact") if r["event"] == "redact" and r["direction"] == "output"]
    assert {f["path"] for f in red[0]["fields"]} == {
        "$.content[0].text",
        "$.content[1].resource.text",
        "$.structuredContent.token",
        "$.structuredContent.nested.list[1]",
    }


def test_structured_content_that_would_break_its_schema_is_withheld(env: Env) -> None:
    result = json.loads(_call(env.vp, 7, "strict", {}))["result"]
    assert result["isError"] is True and "structuredContent" not in result
    assert "withheld" in result["content"][-1]["text"]


def test_truncation_never_splits_a_multibyte_character(env: Env) -> None:
    raw = _call(env.vp, 8, "utf8", {"n": 3000})  # 9000 bytes of three-byte characters
    result = json.loads(raw.decode("utf-8", "strict"))["result"]
    text = result["content"][0]["text"]
    body, _, note = text.partition("\n[Visor: output truncated")
    assert body == "€" * 1333  # 3999 bytes: the 1334th character would cross 4000
    assert "4000 of 9000 bytes" in note
    assert result["_meta"]["progressToken"] is None


def test_resource_reads_are_gated_and_redacted(env: Env) -> None:
    vp = env.vp
    for i, uri in enumerate(
        ("file:///home/me/.env", "file:///home/me/project/../.ssh/id_rsa", "secret://vault/x")
    ):
        vp.request({"jsonrpc": "2.0", "id": BIG_ID + i, "method": "resources/read", "params": {"uri": uri}})
        raw = vp.recv_raw()
        assert f'"id":{BIG_ID + i}'.encode() in raw
        err = json.loads(raw)["error"]
        assert err["code"] == -32602 and "Visor denied resources/read" in err["message"]
    vp.request(
        {"jsonrpc": "2.0", "id": 20, "method": "resources/subscribe", "params": {"uri": "file:///x/.env"}}
    )
    assert json.loads(vp.recv_raw())["error"]["code"] == -32602
    vp.request({"jsonrpc": "2.0", "id": 21, "method": "resources/read", "params": {"uri": "memo://ok"}})
    result = vp.recv()["result"]
    assert result["contents"][0]["text"] == (
        "DB=postgres://app:[REDACTED:password]@db/x\nTOKEN=[REDACTED:github_token]\n"
    )
    assert result["_meta"] == {"k": 1}
    assert [m["params"]["uri"] for m in env.server_received()] == ["memo://ok"]
    denies = [r for r in env.records(wait_for="deny") if r["event"] == "deny"]
    assert [d["method"] for d in denies] == ["resources/read"] * 3 + ["resources/subscribe"]
    assert denies[0]["rule"] == "resource.sensitive" and denies[2]["rule"] == "servers[leaky].resources.deny"


def test_prompts_are_gated_and_their_arguments_and_messages_redacted(env: Env) -> None:
    vp = env.vp
    vp.request({"jsonrpc": "2.0", "id": 30, "method": "prompts/get", "params": {"name": "forbidden-one"}})
    assert vp.recv()["error"]["code"] == -32602
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": 31,
            "method": "prompts/get",
            "params": {"name": "review", "arguments": {"code": f"id={AWS_ID}"}},
        }
    )
    text = vp.recv()["result"]["messages"][0]["content"]["text"]
    assert ANTHROPIC not in text and AWS_ID not in text and "[REDACTED:anthropic_key]" in text
    (got,) = env.server_received()
    assert got["params"]["arguments"] == {"code": "id=[REDACTED:aws_access_key_id]"}


def test_denied_sampling_is_answered_to_the_server_never_shown_to_the_client(env: Env) -> None:
    result = json.loads(_call(env.vp, 40, "sample", {}))["result"]
    answer = json.loads(result["content"][0]["text"])
    assert answer["id"] == "s-1" and answer["error"]["code"] == -32600
    sentinel(env.vp)
    deny = next(
        r
        for r in env.records(wait_for="deny")
        if r["event"] == "deny" and r.get("method") == "sampling/createMessage"
    )
    assert deny["rule"] == "servers[leaky].server_requests.sampling"


def test_a_hidden_tool_is_still_denied(env: Env) -> None:
    result = json.loads(_call(env.vp, 50, "forbidden", {}))["result"]
    assert result["isError"] is True and "Visor denied" in result["content"][0]["text"]
    assert env.server_received() == []
