"""One hostile message from either side is dropped or answered; it never ends the session.

Under uvloop an exception escaping a protocol callback closes that pipe: one
bad line from the client (or the server) used to end the whole session and
lose the rest of the chunk it came in.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import VisorProcess, received, sentinel

HOSTILE = Path(__file__).parents[1] / "servers" / "hostile.py"


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{"a":1}}}',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":true}}',
    ],
)
def test_client_cancel_with_an_unhashable_or_bogus_request_id_is_absorbed(
    visor: VisorProcess, recorder_log: Path, line: bytes
) -> None:
    visor.send(line + b"\n")
    sentinel(visor)
    # It names no request the server saw: nothing but the sentinel reached it.
    assert [b'"cancelled"' in r for r in received(recorder_log)] == [False]


def test_client_cancel_of_true_does_not_cancel_request_1(tmp_path: Path) -> None:
    # true == 1 and hash(true) == hash(1) in Python: a bogus id must not alias a real one.
    from tests.approval.helpers import call, start

    approval_dir = tmp_path / "approvals"
    vp, _log, _ = start(tmp_path, echo_approval=True, approval_dir=approval_dir)
    try:
        call(vp, 1, "echo", {"x": 1})
        deadline_pending = _wait_for(lambda: list(approval_dir.glob("*.pending")))
        assert deadline_pending
        vp.request({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": True}})
        sentinel(vp)
        assert list(approval_dir.glob("*.pending")), "the waiting call was withdrawn by requestId true"
    finally:
        vp.kill()


def _wait_for(pred, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    return pred()


def test_tool_call_with_a_non_string_protocol_version_in_meta_is_decided(
    visor: VisorProcess, recorder_log: Path
) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": [1]}
    visor.request(
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {}, "_meta": meta},
        }
    )
    assert visor.recv()["id"] == 5
    sentinel(visor)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[VisorProcess]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        'version: "1.0"\ndefault_action: deny\nservers:\n  - name: "h"\n    allowed: true\n'
        '    tools:\n      - name: "emit"\n        allowed: true\n'
    )
    vp = VisorProcess(
        [sys.executable, str(HOSTILE)],
        visor_args=[
            "--server-name",
            "h",
            "--policy",
            str(policy),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
    )
    vp.request({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
    assert "tools" in vp.recv()["result"]
    yield vp
    vp.kill()


def emit(vp: VisorProcess, msg_id: int, lines: list[str]) -> dict:
    vp.request(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "tools/call",
            "params": {"name": "emit", "arguments": {"lines": lines}},
        }
    )
    return vp.recv()


@pytest.mark.parametrize(
    "line",
    [
        '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}',
        '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{"a":1}}}',
    ],
)
def test_server_cancel_with_an_unhashable_request_id_is_dropped(hostile: VisorProcess, line: str) -> None:
    # The bogus notification is dropped; the call's own answer and later traffic still flow.
    resp = emit(hostile, 7, [line])
    assert resp["id"] == 7 and "result" in resp
    sentinel(hostile)
