"""Red-team findings on redaction: secrets that passed Visor unredacted while their reader got them.

Each was found through a real `visor run` (the end-to-end test below replays them) and is
pinned at the unit level too:

* a JSON escape inside a string that is JSON text itself (``{"token": "\\u0067hp_..."}``):
  the MCP SDK's server parses such a string argument with json.loads, so the server got the
  token, and the audit log recorded it;
* an AWS secret in JSON text nested in JSON (``\\"SecretAccessKey\\": \\"...\\"``, what a tool
  that returns a command's JSON output inside its own JSON result sends);
* a token glued to CJK text (``令牌是ghp_...``): the word-boundary check counted any Unicode
  letter as part of a word;
* a ``blob`` (or an image-shaped ``data``) anywhere in a server's output was skipped as binary,
  also in ``structuredContent``, ``_meta`` and a log message's data, which are text.

5. A Slack webhook URL as the destination of an asked or denied call: the verdict's ``reason``
   and ``destination`` quote it, and went whole to the audit log, the client's denial, the
   approval question and stderr. They are redacted as the arguments are (visor/core/checks.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import VisorProcess, sentinel
from visor import redact
from visor.redact import DEFAULT_REDACTOR, Finding, redact_arguments, redact_output

GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HOOK = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"

ARGS = DEFAULT_REDACTOR.arguments
OUTS = DEFAULT_REDACTOR.outputs


def _out(value: object, path: str = "$") -> tuple[object, list[Finding]]:
    findings: list[Finding] = []
    return redact_output(value, OUTS, path, findings), findings


# ------------------------------------------------------------------ escapes inside a string


def _escaped(secret: str) -> str:
    """`secret` with its first character as a JSON \\u escape, inside JSON text."""
    return json.dumps({"token": "X"}).replace("X", f"\\u{ord(secret[0]):04x}{secret[1:]}")


@pytest.mark.parametrize(
    "text",
    [
        _escaped(GITHUB),
        _escaped(AWS_ID),
        json.dumps({"token": "X"}).replace("X", "".join(f"\\u{ord(c):04x}" for c in GITHUB)),
        '{"db": "postgres:\\/\\/bob:hunter2pw@db.example\\/x"}',
        '{"k": "-----BEGIN RSA PRIVATE KEY-----\\nMIIEow\\u0049BAAKCAQEA7\\n-----END RSA PRIVATE KEY-----"}',
    ],
)
def test_a_secret_spelled_with_json_escapes_inside_a_string_is_redacted(text: str) -> None:
    assert ARGS.may_match(json.dumps({"a": text}).encode())
    new, findings = redact_arguments(ARGS, {"cfg": text})
    assert findings, text
    # the string stays the JSON text it was, and what its reader gets holds no secret
    reread = json.dumps(json.loads(new["cfg"]))
    for secret in (GITHUB, AWS_ID, "hunter2pw", "MIIEowIBAAKCAQEA7"):
        assert secret not in reread
        assert secret not in new["cfg"]


def test_escapes_that_spell_no_secret_leave_the_string_alone() -> None:
    for text in ('{"name": "caf\\u00e9", "url": "https:\\/\\/example.com\\/x"}', "C:\\users\\u12 \\u0041"):
        new, findings = redact_arguments(ARGS, {"a": text})
        assert findings == [] and new["a"] is text


def test_an_escaped_backslash_is_not_an_escape() -> None:
    # "\\\\u0067" reads as a backslash and "u0067": no g, no token (one level of reading)
    text = "\\\\u0067" + GITHUB[1:]
    assert ARGS.redact_text(text) == (text, [])


def test_plain_and_escaped_secrets_in_one_string_are_both_redacted() -> None:
    text = f"{GITHUB} and \\u0041{AWS_ID[1:]} and x\\u0041{AWS_ID[1:]}"
    new, hits = ARGS.redact_text(text)
    assert GITHUB not in new and "\\u0041" + AWS_ID[1:] in new.split("and x")[1]  # boundary kept
    assert new.startswith("[REDACTED:github_token] and [REDACTED:aws_access_key_id] and x")
    assert dict(hits) == {"github_token": 1, "aws_access_key_id": 1}


# ------------------------------------------------------------------ JSON inside JSON


def test_an_aws_secret_in_json_text_nested_in_json_is_redacted() -> None:
    stdout = json.dumps({"Credentials": {"AccessKeyId": "ASIAxx", "SecretAccessKey": AWS_SECRET}}, indent=4)
    text = json.dumps({"stdout": stdout})  # a tool's JSON result holding a command's JSON output
    (new, findings) = _out({"content": [{"type": "text", "text": text}]})
    assert AWS_SECRET not in json.dumps(new)
    assert [f.pattern for f in findings] == ["aws_secret_access_key"]
    twice = json.dumps({"log": text})
    assert AWS_SECRET not in OUTS.redact_text(twice)[0]


# ------------------------------------------------------------------ word boundary


@pytest.mark.parametrize("before", ["我的令牌是", "密钥", "clé:é", "トークン"])
def test_a_token_after_a_non_ascii_letter_is_redacted(before: str) -> None:
    for secret in (GITHUB, AWS_ID, "sk-ant-" + "a" * 30):
        new, hits = OUTS.redact_text(before + secret)
        assert secret not in new and hits, (before, secret)


def test_a_token_inside_an_ascii_word_is_still_left_alone() -> None:
    assert OUTS.redact_text("x" + AWS_ID) == ("x" + AWS_ID, [])


# ------------------------------------------------------------------ binary payloads


@pytest.mark.parametrize(
    ("result", "where"),
    [
        ({"content": [], "structuredContent": {"file": {"uri": "x", "blob": GITHUB}}}, "structuredContent"),
        ({"content": [], "structuredContent": {"blob": GITHUB}}, "structuredContent"),
        ({"content": [], "_meta": {"blob": GITHUB}}, "_meta"),
        (
            {"content": [], "structuredContent": {"type": "image", "mimeType": "text/plain", "data": GITHUB}},
            "structuredContent",
        ),
        ({"content": [{"type": "text", "text": "x", "_meta": {"uri": "u", "blob": GITHUB}}]}, "content"),
    ],
)
def test_a_blob_outside_content_blocks_is_text_and_redacted(result: dict, where: str) -> None:
    new, findings = _out(result)
    assert GITHUB not in json.dumps(new), where
    assert findings


def test_a_blob_in_a_log_message_is_redacted() -> None:
    params = {"level": "info", "data": {"uri": "u", "blob": GITHUB}}
    new, findings = _out(params, "$.params")
    assert GITHUB not in json.dumps(new) and findings


@pytest.mark.parametrize(
    ("value", "path", "keep"),
    [
        (
            {"content": [{"type": "image", "mimeType": "image/png", "data": GITHUB}]},
            "$",
            ("content", 0, "data"),
        ),
        (
            {"content": [{"type": "resource", "resource": {"uri": "f", "blob": GITHUB}}]},
            "$",
            ("content", 0, "resource", "blob"),
        ),
        ({"contents": [{"uri": "f", "mimeType": "x", "blob": GITHUB}]}, "$.result", ("contents", 0, "blob")),
        (
            {"messages": [{"role": "user", "content": {"type": "audio", "mimeType": "a", "data": GITHUB}}]},
            "$.result",
            ("messages", 0, "content", "data"),
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "mimeType": "i", "data": GITHUB}]}]},
            "$.params",
            ("messages", 0, "content", 0, "data"),
        ),
    ],
)
def test_binary_payloads_where_mcp_puts_them_stay_whole(value: dict, path: str, keep: tuple) -> None:
    new, findings = _out(value, path)
    node: object = new
    for step in keep:
        node = node[step]  # type: ignore[index]
    assert node == GITHUB and findings == []


# ------------------------------------------------------------------ through a real visor run

SERVER = r"""
import json, os, sys
G = os.environ["SECRET_GH"]; S = os.environ["SECRET_AWS"]
stdout = json.dumps({"Credentials": {"AccessKeyId": "ASIAxx", "SecretAccessKey": S}}, indent=4)
OUT = {
    "blob": {"content": [{"type": "text", "text": "x"}], "structuredContent": {"file": {"uri": "u", "blob": G}}},
    "nested": {"content": [{"type": "text", "text": json.dumps({"stdout": stdout})}]},
    "cjk": {"content": [{"type": "text", "text": "我的令牌是" + G}]},
}
def send(o):
    sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    with open(os.environ["RECV"], "a") as f:
        f.write(line)
    m = json.loads(line)
    if m.get("method") == "tools/list":
        tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "out", "post_message")]
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": tools}})
    elif m.get("method") == "tools/call":
        args = m["params"]["arguments"]
        if m["params"]["name"] == "out":
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": {"uri": "u", "blob": G}}})
            send({"jsonrpc": "2.0", "id": m["id"], "result": OUT[args["k"]]})
        else:
            send({"jsonrpc": "2.0", "id": m["id"], "result": {"content": [{"type": "text", "text": "ok"}]}})
    elif "id" in m and "method" in m:
        send({"jsonrpc": "2.0", "id": m["id"], "result": {}})
"""

POLICY = """\
version: "1.0"
default_action: deny
servers:
  - name: "t"
    allowed: true
    tools:
      - {name: echo, allowed: true}
      - {name: out, allowed: true}
      - {name: post_message, allowed: true, exfiltrating: true}
"""


def _visor(tmp_path: Path) -> tuple[VisorProcess, Path, Path]:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "policy.yaml").write_text(POLICY)
    recv, audit = tmp_path / "recv.jsonl", tmp_path / "audit.jsonl"
    recv.write_bytes(b"")
    vp = VisorProcess(
        [sys.executable, str(tmp_path / "server.py")],
        env={"RECV": str(recv), "SECRET_GH": GITHUB, "SECRET_AWS": AWS_SECRET},
        visor_args=[
            "--server-name",
            "t",
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--audit-log",
            str(audit),
        ],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert vp.recv()["id"] == "list"
    return vp, recv, audit


def _finish(vp: VisorProcess, audit: Path) -> bytes:
    sentinel(vp)
    vp.close_stdin()
    vp.wait()
    deadline = time.monotonic() + 5
    data = audit.read_bytes()
    while b'"redact"' not in data and time.monotonic() < deadline:
        time.sleep(0.02)
        data = audit.read_bytes()
    return data


def test_escaped_nested_glued_and_blob_secrets_through_visor_run(tmp_path: Path) -> None:
    vp, recv, audit = _visor(tmp_path)
    cfg = _escaped(GITHUB)
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"cfg": cfg}},
        }
    )
    assert vp.recv()["id"] == 1
    client: list[bytes] = []
    for i, k in enumerate(("blob", "nested", "cjk"), start=2):
        vp.request(
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": "out", "arguments": {"k": k}},
            }
        )
        client.append(vp.recv_raw())  # the log message
        client.append(vp.recv_raw())  # the result
    log = _finish(vp, audit)
    received = recv.read_text()
    # what the server's json.loads makes of the argument (the MCP SDK pre-parses such strings)
    sent = json.loads(
        next(json.loads(x) for x in received.splitlines() if '"echo"' in x)["params"]["arguments"]["cfg"]
    )
    assert GITHUB not in json.dumps(sent)
    everything = b"".join(client) + log
    for secret in (GITHUB, AWS_SECRET, GITHUB[1:]):
        assert secret.encode() not in everything, secret
    assert b"[REDACTED:" in b"".join(client)


def test_a_slack_webhook_destination_is_not_recorded_whole(tmp_path: Path) -> None:
    vp, _recv, audit = _visor(tmp_path)
    args = {"url": HOOK, "text": "hi"}
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "post_message", "arguments": args},
        }
    )
    answer = vp.recv_raw()
    log = _finish(vp, audit)
    assert "slack_webhook" in redact.BUILTIN_NAMES
    assert HOOK.encode() not in answer
    assert HOOK.encode() not in log
    assert HOOK not in vp.stderr
